"""Scale-free features: multiplying a signal whose level depends on the model by a
constant leaves every feature unchanged (window and run context); the loss's window
features ignore its offset.

Tolerance: a power of two scales every floating-point operation exactly (no overflow
or underflow here), so x1024 must give the same bits; x1000 rounds each product, and
the sums that cancel (slopes, deviations) amplify those last bits: measured at most
4.8e-12 relative (features above 1e-6) and 4.2e-13 absolute on every_signal_run, with
the same NaN pattern; the test allows rtol 1e-9 and atol 1e-12.
"""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from collapse_guard.features import READINGS, FeatureExtractor, reading
from collapse_guard.predictor import RiskModel
from collapse_guard.runfiles.format import RunMeta
from collapse_guard.runfiles.reader import read_run
from collapse_guard.runfiles.writer import write_run
from collapse_guard.signals import SIGNAL_NAMES, SIGNALS

from .traces import rewarm_run

RATIO_SIGNALS = sorted(s for s in SIGNAL_NAMES if reading(s) == "ratio")


def test_which_signals_are_read_scale_free():
    # decided from collapse_guard/signals.py (the reasons: features/readings.py)
    assert RATIO_SIGNALS == sorted(
        [
            "grad_norm",
            "bottom_grad_norm",
            "param_norm",
            "update_ratio",
            "attn_logit_max",
            "output_logit_max",
            "lr",
            "loss_scale",
            "sharpness",
            "host_mem_available",
            "gpu_power_w",
            "gpu_mem_used",
            "opt_m_rms",
            "opt_v_rms",
            "opt_update_rms",
            "opt_ortho_rms",
        ]
    )
    assert [s for s in SIGNAL_NAMES if reading(s) == "shift"] == ["loss"]
    assert set(READINGS) <= set(SIGNAL_NAMES)  # no stale name
    names = FeatureExtractor().schema.names
    for s in RATIO_SIGNALS:  # no raw level of these, anywhere in the vector
        assert not {f"{s}__{k}" for k in ("last", "mean", "min", "max", "slope", "std")} & set(
            names
        )
    assert "bottom_grad_norm__frac_over" not in names  # its seed threshold is a raw level


def every_signal_run(seed: int = 0):
    """rewarm_run plus the other scale-dependent signals, at their own levels."""
    frame = rewarm_run(steps=800, seed=seed)
    rng = np.random.default_rng(seed + 100)
    n = len(frame)
    frame["bottom_grad_norm"] = frame["grad_norm"] * rng.uniform(0.01, 0.05, n)
    frame["update_ratio"] = 1e-3 * rng.lognormal(0, 0.2, n)
    frame["loss_scale"] = 2.0 ** np.minimum(16, 10 + frame["step"] // 100)
    frame["sharpness"] = np.where(frame["step"] % 50 == 0, rng.lognormal(3, 0.3, n), np.nan)
    frame["grad_nonfinite"] = 0.0
    return frame


@pytest.mark.parametrize("factor", [1024.0, 1000.0, 1 / 1024])
def test_multiplying_scale_dependent_signals_changes_no_feature(factor):
    frame = every_signal_run()
    fx = FeatureExtractor()
    scaled = frame.copy()
    scaled[[s for s in RATIO_SIGNALS if s in frame]] *= factor
    base = fx.transform_run(frame, stride=7).to_numpy()
    got = fx.transform_run(scaled, stride=7).to_numpy()
    # the rescaled signals' features and the context are measured: the test has teeth
    moved = [s for s in RATIO_SIGNALS if s in frame]
    read = [i for i, n in enumerate(fx.schema.names) if n.split("__")[0] in {*moved, "ctx"}]
    assert len(moved) == 9 and np.isfinite(base[:, read]).mean() > 0.9  # all but telemetry
    if factor in (1024.0, 1 / 1024):
        assert np.array_equal(got, base, equal_nan=True)
    else:
        np.testing.assert_allclose(got, base, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("signal", ["grad_norm", "param_norm", "attn_logit_max", "lr"])
def test_each_signal_alone_is_read_scale_free(signal):
    # one signal at a time at another model's level: only its own features could move
    frame = every_signal_run(seed=3)
    fx = FeatureExtractor()
    scaled = frame.assign(**{signal: frame[signal] * 1000.0})
    base = fx.transform_run(frame, stride=13).to_numpy()
    np.testing.assert_allclose(
        fx.transform_run(scaled, stride=13).to_numpy(), base, rtol=1e-9, atol=1e-12
    )


def test_the_loss_window_features_ignore_its_offset():
    # log(vocabulary) sets the loss's level: + 5.3 nats (bytes -> 50k tokens) moves no
    # window feature of the loss; the context reads it as ratios to its own history
    frame = every_signal_run(seed=4)
    fx = FeatureExtractor()
    shifted = frame.assign(loss=frame["loss"] + 5.3)
    base, got = fx.transform_run(frame, stride=11), fx.transform_run(shifted, stride=11)
    loss = [n for n in fx.schema.names if n.startswith("loss__") and n != "loss__ewma_ratio"]
    assert "loss__ewma_ratio" not in fx.schema.names  # a ratio of levels: not offset-free
    np.testing.assert_allclose(got[loss].to_numpy(), base[loss].to_numpy(), rtol=1e-9, atol=1e-9)
    others = [n for n in fx.schema.names if not n.startswith(("loss__", "ctx__loss"))]
    assert np.array_equal(got[others].to_numpy(), base[others].to_numpy(), equal_nan=True)


OPTIMIZER_SIGNALS = [s.name for s in SIGNALS if s.group == "optimizer"]


def _old_run_file(tmp_path, frame):
    """``frame`` as a run file written before the optimizer group existed: no columns."""
    path = write_run(tmp_path / "new.parquet", frame, RunMeta("r", "real"))
    table = pq.read_table(path).drop_columns(OPTIMIZER_SIGNALS)  # the footer's meta is kept
    pq.write_table(table, tmp_path / "old.parquet")
    return tmp_path / "old.parquet"


def test_an_old_run_file_reads_and_gives_nan_optimizer_features(tmp_path):
    frame = every_signal_run(seed=5)
    old, _ = read_run(_old_run_file(tmp_path, frame))
    assert old[OPTIMIZER_SIGNALS].isna().all().all()
    fx = FeatureExtractor()
    feats = fx.transform_run(old, stride=17)
    ours = [n for n in fx.schema.names if n.split("__")[0] in OPTIMIZER_SIGNALS]
    assert len(ours) == 6 * 9 + 4 * 8  # 6 read as levels, 4 as ratios (none has a threshold)
    assert feats[ours].isna().all().all()
    others = [n for n in fx.schema.names if n not in set(ours)]
    assert np.array_equal(
        feats[others].to_numpy(),
        fx.transform_run(frame, stride=17)[others].to_numpy(),
        equal_nan=True,
    )


def test_the_bundled_model_gives_the_same_risk_to_the_bit_with_or_without_them(tmp_path):
    model = RiskModel.load()
    assert not set(model.schema.signals) & set(OPTIMIZER_SIGNALS)  # trained without them
    frame = every_signal_run(seed=6)
    rng = np.random.default_rng(6)
    measured = frame.assign(**{s: rng.lognormal(0, 1, len(frame)) for s in OPTIMIZER_SIGNALS})
    old, _ = read_run(_old_run_file(tmp_path, measured))
    risk = np.asarray(model.predict_run(frame, stride=5))
    assert np.isfinite(risk).all() and risk.std() > 0  # a real risk curve, not a constant
    assert np.array_equal(np.asarray(model.predict_run(measured, stride=5)), risk)
    assert np.array_equal(np.asarray(model.predict_run(old, stride=5)), risk)
