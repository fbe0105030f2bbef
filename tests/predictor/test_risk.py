"""RiskModel: save/load without pickle, window = run, levels, explain, clear load errors."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import numpy as np
import pytest

from collapse_guard.predictor import risk as risk_module
from collapse_guard.predictor.risk import ModelFormatError, RiskModel


@pytest.fixture(scope="module")
def model(trained):
    return trained[0]


@pytest.fixture(scope="module")
def frame(run_records):
    return run_records[1].frame


def test_predict_window_equals_predict_run_at_that_step(model, frame):
    risk = model.predict_run(frame)
    assert risk.name == "p_collapse" and risk.index.name == "step"
    assert len(risk) == frame["step"].iloc[-1] - frame["step"].iloc[0] + 1
    for step in frame["step"].to_numpy()[[0, 5, 250, -1]]:
        window = frame[frame["step"] <= step]
        assert model.predict_window(window) == risk.loc[step]
    many = model.predict_windows([frame.iloc[:300], frame.iloc[:600]])
    np.testing.assert_array_equal(many, risk.loc[frame["step"].iloc[[299, 599]]].to_numpy())
    assert ((risk >= 0) & (risk <= 1)).all()


def test_subset_of_signals_still_predicts(model, frame):
    p = model.predict_run(frame[["step", "loss", "grad_norm"]], stride=50)
    assert np.isfinite(p).all()


def test_save_load_round_trip_is_plain_text(model, frame, tmp_path):
    folder = model.save(tmp_path / "m")
    assert sorted(p.name for p in folder.iterdir()) == ["model.txt", "risk_model.json"]
    loaded = RiskModel.load(folder)
    np.testing.assert_array_equal(
        loaded.predict_run(frame, stride=7).to_numpy(),
        model.predict_run(frame, stride=7).to_numpy(),
    )
    assert loaded.thresholds == model.thresholds
    for key in ("name", "version", "schema_fingerprint", "horizon", "data_fingerprint"):
        assert loaded.meta[key] == model.meta[key]
    assert (folder / "model.txt").stat().st_size < 5_000_000


def test_levels_and_explain(model, frame):
    th = model.thresholds
    assert list(th) == ["watch", "warn", "critical"]
    assert th["watch"] <= th["warn"] <= th["critical"]
    assert model.level(0.0) == "ok" and model.level(1.0) == "critical"
    top = model.explain(frame, k=5)
    assert len(top) == 5 and all(name in model.schema.names for name, _ in top)
    assert abs(top[0][1]) >= abs(top[-1][1])


def test_wrong_feature_version_or_format_is_a_clear_error(model, tmp_path):
    folder = model.save(tmp_path / "m")
    spec_path = folder / "risk_model.json"
    spec = json.loads(spec_path.read_text())
    spec["schema"]["version"] = "0"
    spec_path.write_text(json.dumps(spec))
    with pytest.raises(ModelFormatError, match=r"feature version '0'.*retrain"):
        RiskModel.load(folder)
    spec["format_version"] = 99
    spec_path.write_text(json.dumps(spec))
    with pytest.raises(ModelFormatError, match="format version 99"):
        RiskModel.load(folder)
    with pytest.raises(FileNotFoundError, match="not a model folder"):
        RiskModel.load(tmp_path / "nothing")


def test_default_load_without_bundle_says_make_default_model(monkeypatch, tmp_path):
    monkeypatch.setattr(risk_module, "DEFAULT_MODEL_DIR", tmp_path / "default_model")
    with pytest.raises(FileNotFoundError, match="make default-model"):
        RiskModel.load()


def test_registry_uri_is_resolved_by_the_registry_module(model, tmp_path, monkeypatch):
    folder = model.save(tmp_path / "m")
    seen = []
    fake = types.ModuleType("collapse_guard.predictor.registry")
    fake.load_model_folder = lambda uri: seen.append(uri) or folder
    monkeypatch.setitem(sys.modules, "collapse_guard.predictor.registry", fake)
    loaded = RiskModel.load("models:/collapse-predictor@champion")
    assert seen == ["models:/collapse-predictor@champion"]
    assert loaded.thresholds == model.thresholds


def test_importing_the_predictor_pulls_neither_torch_nor_mlflow():
    code = (
        "import sys, collapse_guard.predictor as p; p.RiskModel; p.train_risk_model; "
        "print(sorted(m for m in ('torch', 'mlflow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
