"""MLflow against a real SQLite store: logging, promotion, loading by alias."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ops_fixtures import mlflow_store, trained

from collapse_guard.predictor.core.risk import RiskModel
from collapse_guard.predictor.lifecycle import promotion, registry


@pytest.fixture
def store(tmp_path_factory, monkeypatch):
    uri = mlflow_store(tmp_path_factory.getbasetemp())
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The trained model, two copies at other warn levels, and the test runs.

    ``eager``: levels set for one false alarm per 100 healthy steps (an operator's looser
    budget): it catches the test collapses within that budget. ``silent``: levels above
    every score, so it never alarms. Promotion judges each at its own stored level.
    """
    from collapse_guard.predictor.training.train import set_levels

    model, _, splits = trained(tmp_path_factory.getbasetemp())
    folder = tmp_path_factory.mktemp("levels")

    def copy(name):
        return RiskModel.load_folder(model.save(folder / name))

    healthy = [r for r in splits["validation"] if not r.collapsed]
    eager = set_levels(copy("eager"), healthy, {"watch": 10, "warn": 100, "critical": 1000})
    silent = copy("silent").with_thresholds({"watch": 1.0, "warn": 1.0, "critical": 1.0})
    return model, eager, silent, splits["test"]


def test_the_package_exports_the_training_result_and_its_logging_without_torch():
    code = (
        "import sys; from collapse_guard.predictor import TrainingResult, log_result; "
        "from collapse_guard.predictor.lifecycle import registry; "
        "from collapse_guard.predictor.training import train; "
        "assert TrainingResult is train.TrainingResult and log_result is registry.log_result; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_store_is_imported_from_store_not_from_the_registry():
    """The registry is heavy (mlflow, matplotlib, training): a reader of the store's URI
    (the service's alias poll) must not pay for it, so the registry re-exports none."""
    for name in ("tracking_uri", "use_store", "FOLDER_ARTIFACT"):
        assert not hasattr(registry, name) and name not in registry.__all__


def test_experiment_artifacts_live_beside_the_database(store):
    import mlflow

    experiment_id = registry.ensure_experiment("artifact-place")
    assert registry.ensure_experiment("artifact-place") == experiment_id
    location = mlflow.MlflowClient(store).get_experiment(experiment_id).artifact_location
    database_folder = store.removeprefix("sqlite:///").rsplit("/", 1)[0]
    assert location == f"file://{database_folder}/artifacts/artifact-place"


def test_champion_moves_only_when_the_rule_says_and_loads_by_alias(store, models):
    import mlflow

    _, eager, silent, test_runs = models
    name = "cp-promotion"

    def log(model, label):
        return registry.log_training(
            model,
            metrics={"m": 1.0},
            comparison_runs=test_runs,
            params={"label": label},
            fingerprint=label,
            experiment="promotion",
            model_name=name,
        )

    first = log(silent, "silent")
    assert first.promoted and first.version == "1" and first.previous_champion is None
    assert registry.champion_version(name) == "1"

    better = log(eager, "eager")
    challenger, champion = better.decision.challenger, better.decision.champion
    # each at its own stored warn level, on the same runs, named by its registered version
    assert challenger == promotion.score_at_warn(eager, test_runs, name="2")
    assert "challenger v2: " in better.reason and "champion v1: " in better.reason
    assert f"v{eager.meta['version']}" not in better.reason
    assert champion.threshold == 1.0 and challenger.threshold == eager.thresholds["warn"]
    assert (champion.caught, champion.false_alarms) == (0, 0)
    assert challenger.caught == challenger.n_collapsed == 4 and challenger.within_budget
    assert better.promoted and registry.champion_version(name) == "2", better.reason

    again = log(silent, "silent-again")
    assert not again.promoted and "no higher recall" in again.reason
    assert registry.champion_version(name) == "2"
    run = mlflow.MlflowClient(store).get_run(again.run_id)
    assert run.data.tags["promotion"] == "kept"
    assert run.data.tags["previous_champion"] == "2"
    assert run.data.metrics["compare.champion.recall_at_warn"] == 1.0
    assert run.data.metrics["compare.challenger.recall_at_warn"] == 0.0
    assert run.data.metrics["compare.n_runs"] == len(test_runs)
    record = mlflow.artifacts.load_dict(f"runs:/{again.run_id}/promotion.json")
    assert record["comparison_run_ids"] == [r.run_id for r in test_runs]

    loaded = RiskModel.load(f"models:/{name}@champion")
    assert loaded.meta["version"] == "2"
    assert loaded.meta["data_fingerprint"] == eager.meta["data_fingerprint"]
    assert loaded.thresholds == eager.thresholds
    by_number = RiskModel.load(f"models:/{name}/3")
    assert by_number.thresholds == silent.thresholds


def test_the_pyfunc_model_is_code_not_a_pickle_and_scores_like_the_folder(
    store, models, tmp_path, capfd
):
    import mlflow

    good, _, _, test_runs = models
    record = registry.log_training(
        good, params={}, fingerprint="f", experiment="pyfunc", model_name="cp-pyfunc"
    )
    assert record.promoted
    # MLflow warns (on stderr) whenever it pickles a python_model with CloudPickle
    assert "CloudPickle" not in capfd.readouterr().err
    uri = "models:/cp-pyfunc@champion"
    local = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(tmp_path))
    files = {p.name for p in Path(local).rglob("*") if p.is_file()}
    assert not {f for f in files if f.endswith(".pkl")}, files
    assert "pyfunc_model.py" in files and "model.txt" in files

    frame = test_runs[0].frame
    served = mlflow.pyfunc.load_model(uri).predict(frame)
    expected = good.predict_run(frame)
    assert list(served.columns) == ["step", "p_collapse", "level"]
    np.testing.assert_allclose(served["p_collapse"].to_numpy(), expected.to_numpy())
    assert list(served["level"]) == [good.level(p) for p in expected.to_numpy()]
    loaded = RiskModel.load(uri)
    np.testing.assert_array_equal(loaded.predict_run(frame).to_numpy(), expected.to_numpy())


def test_loading_by_uri_leaves_no_temporary_folder(store, models, monkeypatch, tmp_path):
    good, _, _, _ = models
    registry.log_training(good, params={}, fingerprint="f", experiment="leak", model_name="cp-leak")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    for _ in range(3):
        RiskModel.load("models:/cp-leak@champion")
    assert list(scratch.iterdir()) == []


def test_loading_an_unknown_model_says_what_to_do(store):
    with pytest.raises(ValueError, match="collapse-guard train"):
        RiskModel.load("models:/no-such-model@champion")


def test_a_champion_this_code_cannot_load_is_replaced(store, models, monkeypatch):
    from collapse_guard.predictor.core.risk import ModelFormatError

    good, _, _, _ = models
    name = "cp-stale"

    def log():
        return registry.log_training(
            good, params={}, fingerprint="f", experiment="stale", model_name=name
        )

    assert log().promoted

    def stale(cls, source=None):
        raise ModelFormatError("feature version 0, this code computes version 1")

    monkeypatch.setattr(RiskModel, "load", classmethod(stale))
    second = log()
    assert second.promoted and "cannot be loaded" in second.reason
    assert registry.champion_version(name) == "2"
