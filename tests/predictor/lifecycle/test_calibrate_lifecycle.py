"""A calibrated model as a model version like any other: registered in MLflow with the runs it
was calibrated on, served, taken by the guard, and made by retrain from the runs it ingests."""

from __future__ import annotations

import json
import os

import mlflow
import pytest
import torch
from predictor_settings import LIFECYCLE_TRAINING
from support import serve_process, wait_ready

from collapse_guard.guard import Guard
from collapse_guard.predictor.core.recalibrate import calibrate
from collapse_guard.predictor.core.risk import RiskModel
from collapse_guard.predictor.lifecycle import registry
from collapse_guard.predictor.lifecycle.retrain import retrain
from collapse_guard.runfiles import read_meta, read_run
from collapse_guard.service.client import RiskClient


@pytest.fixture(scope="module")
def healthy(base_paths):
    return [p for p in base_paths if read_meta(p).onset_step is None][:6]


@pytest.fixture(scope="module")
def tuned(healthy):
    return calibrate(RiskModel.load(), healthy)


def test_a_calibrated_model_registers_naming_its_runs(store, tuned, healthy):
    record = registry.log_calibration(tuned, alias="my-setup")
    assert record.version == "1"
    client = mlflow.MlflowClient()
    tags = client.get_model_version("collapse-predictor", "1").tags
    assert tags["calibrated_on"].startswith(f"{len(healthy)} runs, sha256 ")
    assert tags["base_model_version"] == RiskModel.load().meta["version"]
    path = mlflow.artifacts.download_artifacts(
        run_id=record.run_id, artifact_path="calibrated_on.json"
    )
    with open(path) as f:
        assert json.load(f)["calibrated_on"] == sorted(read_meta(p).run_id for p in healthy)
    loaded = RiskModel.load("models:/collapse-predictor@my-setup")
    assert loaded.thresholds == tuned.thresholds
    assert loaded.meta["base_version"] == tuned.meta["base_version"]


def test_the_guard_takes_a_calibrated_folder(tuned, tmp_path):
    folder = tuned.save(tmp_path / "mine")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = Guard(model, optimizer, checkpoint_dir=tmp_path / "ckpt", risk=str(folder))
    try:
        assert guard.risk.model.thresholds == tuned.thresholds
        assert guard.risk.model.meta["version"] == tuned.meta["version"]
    finally:
        guard.close()
    with pytest.raises(ValueError, match="a model folder"):
        Guard(model, optimizer, checkpoint_dir=tmp_path / "c2", risk=str(tmp_path / "nothing"))


@pytest.mark.slow  # ~10 s: a served instance
def test_a_calibrated_folder_is_served_with_its_levels(tuned, healthy, tmp_path):
    folder = tuned.save(tmp_path / "served-model")
    env = {**os.environ, "BENTOML_HOME": str(tmp_path / "bentoml")}
    env.pop("COLLAPSE_GUARD_TOKEN", None)
    frame = read_run(healthy[0])[0].iloc[:400].drop(columns="event")
    with serve_process(tmp_path, ["--model", str(folder)], env) as (url, proc, log):
        wait_ready(url, proc, log)
        with RiskClient(url, timeout=30) as client:
            answer = client.risk(frame, run_id="a")
    assert answer.model_version == tuned.meta["version"]
    assert answer.level == tuned.level(answer.probability)


@pytest.mark.slow  # ~30 s: a training
def test_retrain_sets_the_challengers_levels_on_the_new_healthy_runs(store, base, new_paths):
    result = retrain([str(new_paths[0].parent)], base=base, **LIFECYCLE_TRAINING)
    challenger = RiskModel.load(f"models:/collapse-predictor/{result.version}")
    new_healthy = {read_meta(p).run_id for p in new_paths if read_meta(p).onset_step is None}
    calibrated = set(challenger.meta.get("calibrated_on", ()))
    assert calibrated and calibrated <= new_healthy
    assert challenger.meta["levels_from"]["by"] == "calibrate"
    # calibrated on, so never compared on
    assert not calibrated & set(result.comparison_run_ids)
