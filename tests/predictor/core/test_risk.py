"""RiskModel: save/load without pickle, window = run, levels, explain, clear load errors."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from predictor_settings import FAST_PARAMS

from collapse_guard.features import RunContext, reading
from collapse_guard.predictor.core import risk as risk_module
from collapse_guard.predictor.core.hold import DEFAULT_HOLD_STEPS, hold_risk
from collapse_guard.predictor.core.risk import ModelFormatError, RiskModel
from collapse_guard.signals import SIGNAL_NAMES


@pytest.fixture(scope="module")
def model(trained):
    return trained[0]


@pytest.fixture(scope="module")
def frame(run_records):
    return run_records[1].frame


def test_predict_window_equals_predict_run_at_that_step(model, frame):
    risk = model.predict_run(frame, held=False)
    assert risk.name == "p_collapse" and risk.index.name == "step"
    assert len(risk) == frame["step"].iloc[-1] - frame["step"].iloc[0] + 1
    for step in frame["step"].to_numpy()[[0, 5, 250, -1]]:
        window = frame[frame["step"] <= step]
        assert model.predict_window(window) == risk.loc[step]
    many = model.predict_windows([frame.iloc[:300], frame.iloc[:600]])
    np.testing.assert_array_equal(many, risk.loc[frame["step"].iloc[[299, 599]]].to_numpy())
    assert ((risk >= 0) & (risk <= 1)).all()


def test_live_context_with_the_last_window_gives_the_run_risk(model, frame):
    # the guard's and the service's way: the last window plus the live RunContext
    risk = model.predict_run(frame, held=False)
    ctx = RunContext.from_schema(model.schema)
    signals = [c for c in frame.columns if c in SIGNAL_NAMES]
    ends, contexts, tails = frame["step"].to_numpy()[[10, 400, -1]], [], []
    for row in frame.itertuples(index=False):
        ctx.update(int(row.step), {name: getattr(row, name) for name in signals})
        if row.step in ends:
            tail = frame[(frame["step"] <= row.step) & (frame["step"] > row.step - 200)]
            assert model.predict_window(tail, context=ctx.get()) == risk.loc[row.step]
            contexts.append(ctx.get())
            tails.append(tail)
    many = model.predict_windows(tails, contexts=contexts)
    np.testing.assert_array_equal(many, risk.loc[ends].to_numpy())
    with pytest.raises(ValueError, match="unknown context fields"):
        model.predict_window(tails[-1], context={"lr_over_peak": 1.0})


@pytest.mark.parametrize("factor", [1024.0, 1000.0])
def test_risk_ignores_the_scale_of_scale_dependent_signals(model, frame, factor):
    # the same run at another model's size: norms, logits, LR x factor. Tolerance as in
    # tests/features/test_readings.py: x1024 is exact; x1000 moves features by < 1e-11
    # relative, far from any split of the trees: the same risk to 1e-12 (measured: 0)
    scaled = frame.copy()
    moved = [s for s in SIGNAL_NAMES if reading(s) == "ratio" and s in frame]
    assert {"grad_norm", "param_norm", "lr"} <= set(moved)
    scaled[moved] *= factor
    for m in (model, RiskModel.load()):  # the test's model and the bundled default
        base, got = m.predict_run(frame, stride=5), m.predict_run(scaled, stride=5)
        assert base.std() > 0.005  # the risk moves along the run: a real comparison
        np.testing.assert_allclose(got.to_numpy(), base.to_numpy(), rtol=0, atol=1e-12)


def test_subset_of_signals_still_predicts(model, frame):
    p = model.predict_run(frame[["step", "loss", "grad_norm"]], stride=50)
    assert np.isfinite(p).all()


def test_the_run_risk_is_held_over_the_models_hold_steps(model, frame):
    assert model.hold_steps == DEFAULT_HOLD_STEPS == 50
    raw, held = model.predict_run(frame, held=False), model.predict_run(frame)
    np.testing.assert_array_equal(held, hold_risk(raw.index, raw.to_numpy(), 50))
    assert (held >= raw).all() and (held > raw).mean() > 0.1  # the hold does hold


def test_a_model_file_without_a_hold_loads_as_raw_risk(model, frame, tmp_path):
    folder = model.save(tmp_path / "m")
    spec_path = folder / "risk_model.json"
    spec = json.loads(spec_path.read_text())
    assert spec["hold_steps"] == 50
    del spec["hold_steps"]  # a model saved before the hold: its levels are on raw risk
    spec_path.write_text(json.dumps(spec))
    older = RiskModel.load(folder)
    assert older.hold_steps == 0
    np.testing.assert_array_equal(older.predict_run(frame), model.predict_run(frame, held=False))


def test_the_fingerprint_names_the_answers_not_only_the_data(model, tmp_path):
    copy = RiskModel.load(model.save(tmp_path / "m"))
    assert copy.fingerprint() == model.fingerprint()
    copy.hold_steps = 25
    assert copy.fingerprint() != model.fingerprint()
    copy.hold_steps = model.hold_steps
    copy.with_thresholds({**model.thresholds, "warn": model.thresholds["warn"] + 1e-6})
    assert copy.fingerprint() != model.fingerprint()


def test_save_load_round_trip_is_plain_text(model, frame, tmp_path):
    folder = model.save(tmp_path / "m")
    assert sorted(p.name for p in folder.iterdir()) == ["model.txt", "risk_model.json"]
    loaded = RiskModel.load(folder)
    np.testing.assert_array_equal(
        loaded.predict_run(frame, stride=7).to_numpy(),
        model.predict_run(frame, stride=7).to_numpy(),
    )
    assert loaded.thresholds == model.thresholds and loaded.hold_steps == model.hold_steps
    for key in ("name", "version", "schema_fingerprint", "horizon", "data_fingerprint"):
        assert loaded.meta[key] == model.meta[key]
    assert (folder / "model.txt").stat().st_size < 5_000_000


def test_levels(model):
    th = model.thresholds
    assert list(th) == ["watch", "warn", "critical"]
    assert th["watch"] <= th["warn"] <= th["critical"]
    assert model.level(0.0) == "ok" and model.level(1.0) == "critical"


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


def test_registry_uri_is_resolved_by_the_store_module(model, tmp_path, monkeypatch):
    from contextlib import contextmanager

    from collapse_guard.predictor.core import store

    folder = model.save(tmp_path / "m")
    seen = []

    @contextmanager
    def fetched(uri):
        seen.append(uri)
        yield folder, {"version": "7", "name": "collapse-predictor", "run_id": "r"}

    monkeypatch.setattr(store, "fetched_model_folder", fetched)
    loaded = RiskModel.load("models:/collapse-predictor@champion")
    assert seen == ["models:/collapse-predictor@champion"]
    assert loaded.thresholds == model.thresholds
    assert loaded.meta["version"] == "7"
    assert loaded.meta["source"] == "models:/collapse-predictor@champion"


def test_importing_the_predictor_pulls_neither_torch_nor_mlflow():
    code = (
        "import sys, collapse_guard.predictor as p; p.RiskModel; p.train_risk_model; "
        "print(sorted(m for m in ('torch', 'mlflow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_model_with_opt_in_context_fields_saves_loads_and_scores_the_same(
    synthetic_paths, frame, tmp_path
):
    from collapse_guard.features.context_fields import OPT_IN_CONTEXT
    from collapse_guard.predictor.training.train import train_risk_model

    model = train_risk_model(
        synthetic_paths[:30], seed=0, stride=10, params=FAST_PARAMS, extra_context=OPT_IN_CONTEXT
    ).model
    assert set(OPT_IN_CONTEXT) <= set(model.schema.context)
    loaded = RiskModel.load(model.save(tmp_path / "m"))
    assert loaded.extractor.schema.names == model.schema.names
    scored = [m.predict_run(frame, stride=7).to_numpy() for m in (loaded, model)]
    np.testing.assert_array_equal(*scored)
