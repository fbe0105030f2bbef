"""retrain end to end on a real SQLite MLflow store: the rule moves the champion, the champion
is never scored on its own runs, the frozen benchmark is reused, a crash loses nothing."""

from __future__ import annotations

import mlflow
import pytest
from lifecycle_models import never_warning_champion
from predictor_settings import LIFECYCLE_BUDGETS, LIFECYCLE_PARAMS, LIFECYCLE_TRAINING

from collapse_guard.predictor.core.model import CollapsePredictor
from collapse_guard.predictor.core.risk import RiskModel
from collapse_guard.predictor.core.seen_runs import SeenRuns
from collapse_guard.predictor.lifecycle import promotion, registry
from collapse_guard.predictor.lifecycle.retrain import KEY_TAG, STATE_TAG, retrain
from collapse_guard.runfiles import list_runs
from collapse_guard.runfiles.records import load_runs

NAME = registry.MODEL_NAME


def version(n: str) -> RiskModel:
    return RiskModel.load(f"models:/{NAME}/{n}")


def versions() -> list[str]:
    client = mlflow.MlflowClient()
    return sorted(str(v.version) for v in client.search_model_versions(f"name = '{NAME}'"))


def seen(model: RiskModel) -> set[str]:
    s = SeenRuns.from_meta(model.meta)
    return set(s.train) | set(s.validation)


@pytest.mark.slow  # ~35 s: two trainings
def test_the_rule_promotes_on_runs_neither_model_saw(store, base, new_paths):
    never_warning_champion(base)
    result = retrain([str(new_paths[0].parent)], base=base, **LIFECYCLE_TRAINING)
    assert len(result.ingest.ingested) == 12 and result.benchmark.created
    champion, challenger = version("1"), version("2")
    bench = set(result.benchmark.run_ids)
    # the benchmark holds runs the champion never saw; the challenger never trains on it
    assert len(bench) == 12 and not bench & seen(champion) and not bench & seen(challenger)
    compared = set(result.comparison_run_ids)
    assert compared and compared <= bench | set(result.ingest.run_ids)
    # neither model is scored on a run it trained or validated on
    assert not compared & seen(champion) and not compared & seen(challenger)
    # the verdict is the rule's, on each model's own stored warn level
    runs = load_runs(list_runs(base))
    fair = [r for r in runs if r.run_id in compared]
    old, new = promotion.score_at_warn(champion, fair), promotion.score_at_warn(challenger, fair)
    assert old.caught == 0 and old.false_alarms == 0  # never warns
    assert new.caught >= 1 and new.within_budget  # seeded: measured 2 of 5, 13 of 27 allowed
    assert promotion.decide(new, old).promoted is result.promoted is True
    assert result.champion == registry.champion_version() == "2"
    run = mlflow.MlflowClient().get_run(result.mlflow_run_id)
    contexts = {
        {t.key: t.value for t in d.tags}["mlflow.data.context"] for d in run.inputs.dataset_inputs
    }
    assert contexts == {"benchmark", "training", "new"}
    assert run.data.tags[STATE_TAG] == "done" and run.data.tags["promotion"] == "promoted"
    assert run.data.metrics["compare.champion.recall_at_warn"] == 0.0
    # the same command again: nothing to do, nothing trained
    again = retrain([str(new_paths[0].parent)], base=base, **LIFECYCLE_TRAINING)
    assert again.resumed and again.version == "2" and versions() == ["1", "2"]


def test_an_identical_challenger_keeps_the_alias_and_the_benchmark_is_reused(store, base):
    first = retrain([], base=base, **LIFECYCLE_TRAINING)
    assert first.promoted and first.version == "1" and first.reason == "no champion yet"
    # the default learning rate spelled out: another job key, the very same model
    same = LIFECYCLE_PARAMS | {"learning_rate": CollapsePredictor().learning_rate}
    second = retrain([], base=base, params=same, budgets=LIFECYCLE_BUDGETS)
    assert second.benchmark.digest == first.benchmark.digest and not second.benchmark.created
    assert version("1").booster.model_to_string() == version("2").booster.model_to_string()
    assert not second.promoted and "tie keeps the champion" in second.reason
    assert registry.champion_version() == "1"
    assert set(second.comparison_run_ids) == set(first.benchmark.run_ids)
    # no settings: the challenger trains as the champion did, so this is the first job again
    # (its key holds the settings; with the defaults it would train 300 rounds anew)
    third = retrain([], base=base)
    assert third.resumed and third.version == "1" and versions() == ["1", "2"]
    assert version("1").meta["train_config"]["params"] == LIFECYCLE_PARAMS


@pytest.mark.slow  # ~40 s: three trainings
def test_a_crash_halfway_loses_nothing(store, base, new_paths, monkeypatch):
    never_warning_champion(base)
    new = [str(new_paths[0].parent)]

    def crash(*args, **kwargs):
        raise RuntimeError("simulated crash")

    # 1. a crash while logging, before the verdict: v2 is registered, never decided
    with monkeypatch.context() as patch:
        patch.setattr(promotion, "compare", crash)
        with pytest.raises(RuntimeError, match="simulated crash"):
            retrain(new, base=base, **LIFECYCLE_TRAINING)
    assert versions() == ["1", "2"] and registry.champion_version() == "1"
    # 2. the rerun trains again (v2 is marked abandoned); it crashes after the verdict,
    #    before the alias moves
    with monkeypatch.context() as patch:
        patch.setattr(mlflow.MlflowClient, "set_registered_model_alias", crash)
        with pytest.raises(RuntimeError, match="simulated crash"):
            retrain(new, base=base, **LIFECYCLE_TRAINING)
    assert versions() == ["1", "2", "3"] and registry.champion_version() == "1"
    client = mlflow.MlflowClient()
    attempts = client.search_runs(
        [registry.ensure_experiment()], filter_string=f"tags.`{KEY_TAG}` != ''"
    )
    tags = {r.data.tags.get(STATE_TAG, "open"): r.data.tags.get("promotion") for r in attempts}
    assert tags == {"abandoned": None, "open": "promoted"}
    assert client.get_model_version(NAME, "2").tags[STATE_TAG] == "abandoned"
    # 3. the rerun finishes the job: the verdict applied, nothing trained
    done = retrain(new, base=base, **LIFECYCLE_TRAINING)
    assert done.resumed and done.promoted and done.version == "3"
    assert registry.champion_version() == "3" and versions() == ["1", "2", "3"]
    assert len(done.ingest.already) == 12 and done.ingest.ingested == []
