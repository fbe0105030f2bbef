"""MLflow against a real SQLite store: logging, promotion, loading by alias."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from ops_fixtures import mlflow_store, trained

from collapse_guard.predictor import registry
from collapse_guard.predictor.cli import comparison_scores
from collapse_guard.predictor.risk import RiskModel


@pytest.fixture
def store(tmp_path_factory, monkeypatch):
    uri = mlflow_store(tmp_path_factory.getbasetemp())
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The trained model, a model fitted on label-shuffled runs, and the test runs."""
    from collapse_guard.predictor.train import fit_risk_model, set_levels

    model, _, splits = trained(tmp_path_factory.getbasetemp())
    train, val = splits["train"], splits["validation"]
    # deal the onsets out to other runs: same label balance, no relation to the signals
    onsets = [r.meta.onset_step for r in train]
    order = np.random.default_rng(0).permutation(len(train))
    shuffled = [
        replace(r, meta=replace(r.meta, onset_step=onsets[j]))
        for r, j in zip(train, order, strict=True)
    ]
    worse, _ = fit_risk_model(shuffled, val, seed=0)
    set_levels(worse, [r for r in val if not r.collapsed])
    return model, worse, splits["test"]


def test_tracking_uri_defaults_to_sqlite_under_cwd(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    assert registry.tracking_uri() == f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    assert (tmp_path / "mlruns").is_dir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://example:5000")
    assert registry.tracking_uri() == "http://example:5000"


def test_beats_primary_then_tie_break():
    assert registry.beats(
        {"recall_at_warn": 0.8, "pr_auc": 0.1}, {"recall_at_warn": 0.7, "pr_auc": 0.9}
    )
    assert registry.beats(
        {"recall_at_warn": 0.8, "pr_auc": 0.5}, {"recall_at_warn": 0.8, "pr_auc": 0.4}
    )
    same = {"recall_at_warn": 0.8, "pr_auc": 0.5}
    assert not registry.beats(same, dict(same)), "a tie must not move the champion"
    assert registry.beats({"recall_at_warn": 0.0, "pr_auc": 0.1}, {"recall_at_warn": math.nan})


def test_experiment_artifacts_live_beside_the_database(store):
    import mlflow

    experiment_id = registry.ensure_experiment("artifact-place")
    assert registry.ensure_experiment("artifact-place") == experiment_id
    location = mlflow.MlflowClient(store).get_experiment(experiment_id).artifact_location
    database_folder = store.removeprefix("sqlite:///").rsplit("/", 1)[0]
    assert location == f"file://{database_folder}/artifacts/artifact-place"


def test_champion_moves_only_when_beaten_and_loads_by_alias(store, models):
    import mlflow

    good, worse, test_runs = models
    score = comparison_scores(test_runs, good.budgets)
    name = "cp-promotion"

    def log(model, label):
        return registry.log_training(
            model,
            metrics={"m": 1.0},
            score=score,
            params={"label": label},
            fingerprint=label,
            experiment="promotion",
            model_name=name,
        )

    first = log(worse, "worse")
    assert first.promoted and first.version == "1" and first.previous_champion is None
    assert registry.champion_version(name) == "1"

    better = log(good, "good")
    assert better.new_scores == score(good)
    assert registry.beats(better.new_scores, better.champion_scores), (
        f"the trained model should beat one fitted on shuffled labels: {better}"
    )
    assert better.promoted and registry.champion_version(name) == "2"

    again = log(worse, "worse-again")
    assert not again.promoted, again
    assert registry.champion_version(name) == "2"
    run = mlflow.MlflowClient(store).get_run(again.run_id)
    assert run.data.tags["promotion"] == "kept"
    assert run.data.tags["previous_champion"] == "2"
    assert "compare.champion.recall_at_warn" in run.data.metrics
    assert "compare.new.pr_auc" in run.data.metrics

    loaded = RiskModel.load(f"models:/{name}@champion")
    assert loaded.meta["version"] == "2"
    assert loaded.meta["data_fingerprint"] == good.meta["data_fingerprint"]
    assert loaded.booster.model_to_string() == good.booster.model_to_string()
    by_number = RiskModel.load(f"models:/{name}/3")
    assert by_number.booster.model_to_string() == worse.booster.model_to_string()


def test_pyfunc_model_scores_a_run_like_the_risk_model(store, models):
    import mlflow

    good, _, test_runs = models
    record = registry.log_training(
        good,
        metrics={},
        score=lambda m: {},
        params={},
        fingerprint="f",
        experiment="pyfunc",
        model_name="cp-pyfunc",
    )
    assert record.promoted
    frame = test_runs[0].frame
    served = mlflow.pyfunc.load_model("models:/cp-pyfunc@champion").predict(frame)
    expected = good.predict_run(frame)
    assert list(served.columns) == ["step", "p_collapse", "level"]
    np.testing.assert_allclose(served["p_collapse"].to_numpy(), expected.to_numpy())
    assert set(served["level"]) <= {"ok", "watch", "warn", "critical"}


def test_loading_an_unknown_model_says_what_to_do(store):
    with pytest.raises(ValueError, match="collapse-guard train"):
        registry.load_model_folder("models:/no-such-model@champion")


def test_a_champion_this_code_cannot_load_is_replaced(store, models, monkeypatch):
    from collapse_guard.predictor.risk import ModelFormatError

    good, _, _ = models
    name = "cp-stale"

    def log():
        return registry.log_training(
            good,
            metrics={},
            score=lambda m: {"recall_at_warn": 0.5, "pr_auc": 0.5},
            params={},
            fingerprint="f",
            experiment="stale",
            model_name=name,
        )

    assert log().promoted

    def stale(cls, source=None):
        raise ModelFormatError("feature version 0, this code computes version 1")

    monkeypatch.setattr(RiskModel, "load", classmethod(stale))
    second = log()
    assert second.promoted and "cannot be loaded" in second.reason
    assert registry.champion_version(name) == "2"
