"""Exact values of each statistic on small hand-made windows."""

import math
import warnings

import numpy as np
import pandas as pd
import pytest

from collapse_guard.features import FeatureExtractor, window_features
from collapse_guard.signals import signal

NAN = math.nan
INF = math.inf


def features(columns: dict[str, list[float]], window: int | None = None) -> dict[str, float]:
    """Feature dict of one window whose columns are given in step order."""
    rows = len(next(iter(columns.values())))
    fx = FeatureExtractor(window=window or rows, signals=tuple(columns))
    values = np.column_stack([np.asarray(v, dtype=float) for v in columns.values()])
    return dict(zip(fx.schema.names, fx.transform_array(values), strict=True))


def test_linear_ramp():
    f = features({"attn_entropy_mean": [2.0 + 0.5 * t for t in range(10)]})
    assert f["attn_entropy_mean__last"] == 6.5
    assert f["attn_entropy_mean__mean"] == 4.25
    assert f["attn_entropy_mean__min"] == 2.0 and f["attn_entropy_mean__max"] == 6.5
    assert f["attn_entropy_mean__slope"] == 0.5
    std = f["attn_entropy_mean__std"]
    assert std == pytest.approx(0.5 * np.std(np.arange(10)), rel=1e-14)
    assert f["attn_entropy_mean__zscore"] == pytest.approx(2.25 / std, rel=1e-14)
    assert f["attn_entropy_mean__nonfinite"] == 0.0


def test_linear_ramp_read_as_ratio_and_as_shift():
    ramp = [2.0 + 0.5 * t for t in range(10)]  # mean 4.25, last 6.5, slope 0.5
    f = features({"grad_norm": ramp, "loss": ramp})
    assert f["grad_norm__last_rel"] == 6.5 / 4.25
    assert f["grad_norm__min_rel"] == 2.0 / 4.25 and f["grad_norm__max_rel"] == 6.5 / 4.25
    assert f["grad_norm__slope_rel"] == 0.5 / 4.25
    std = 0.5 * np.std(np.arange(10))
    assert f["grad_norm__std_rel"] == pytest.approx(std / 4.25, rel=1e-14)
    assert f["loss__last_dev"] == 2.25
    assert f["loss__min_dev"] == -2.25 and f["loss__max_dev"] == 2.25
    assert f["loss__slope"] == 0.5 and f["loss__std"] == pytest.approx(std, rel=1e-14)
    # the same zscore and EWMA ratio whatever the reading
    assert f["grad_norm__zscore"] == f["loss__zscore"]
    s = pd.Series(ramp)
    short, long = s.ewm(span=10).mean().iloc[-1], s.ewm(span=100).mean().iloc[-1]
    assert f["loss__ewma_dev"] == pytest.approx(short - long, rel=1e-12)
    assert f["grad_norm__ewma_ratio"] == pytest.approx(short / long, rel=1e-12)


def test_gaps_are_skipped_not_zero():
    # measured at t = 0, 3, 9 only: stats over those three values, slope over their steps
    f = features({"output_entropy": [1.0, NAN, NAN, 4.0, NAN, NAN, NAN, NAN, NAN, 10.0]})
    assert f["output_entropy__last"] == 10.0 and f["output_entropy__min"] == 1.0
    assert f["output_entropy__max"] == 10.0 and f["output_entropy__mean"] == 5.0
    assert f["output_entropy__slope"] == pytest.approx(1.0, rel=1e-14)
    assert f["output_entropy__nonfinite"] == 0.0


def test_last_is_last_measurement_of_a_sparse_signal():
    kl = [NAN] * 20
    kl[2], kl[12] = 0.7, 0.3
    f = features({"attn_kl": kl})
    assert f["attn_kl__last"] == 0.3


def test_constant_window():
    f = features({"lr": [3e-4] * 50})
    assert f["lr__std_rel"] == 0.0 and f["lr__slope_rel"] == 0.0
    assert f["lr__last_rel"] == 1.0 and f["lr__ewma_ratio"] == 1.0
    assert math.isnan(f["lr__zscore"])  # undefined, not 0 and not huge
    zero = features({"lr": [0.0] * 5})  # a ratio to a mean of 0 is undefined
    assert math.isnan(zero["lr__last_rel"]) and zero["lr__nonfinite"] == 0.0


def test_ewma_ratio_matches_pandas_with_gaps():
    rng = np.random.default_rng(3)
    x = rng.uniform(1, 2, 200)
    x[rng.random(200) < 0.3] = NAN
    f = features({"grad_norm": list(x)})
    s = pd.Series(x)
    expected = s.ewm(span=10).mean().iloc[-1] / s.ewm(span=100).mean().iloc[-1]
    assert f["grad_norm__ewma_ratio"] == pytest.approx(expected, rel=1e-12)


def test_frac_over_agrees_with_signal_over_threshold():
    values = [0.1, 0.5, 0.46, 0.45, NAN, INF, 0.9, 0.2]
    f = features({"grad_cv": values})
    finite = [v for v in values if math.isfinite(v)]
    over = sum(signal("grad_cv").over_threshold(v) for v in finite)
    assert f["grad_cv__frac_over"] == over / len(finite) == 3 / 6
    both = features({"update_cos": [0.05, 0.5, 0.95, 0.5]})  # low and high bands
    assert both["update_cos__frac_over"] == 0.5


def test_nonfinite_counts_measured_values_only():
    f = features(
        {
            "loss": [2.0, NAN, NAN, INF, 2.5],
            "loss_nonfinite": [0, 1, 0, 1, 0],  # NaN with flag 1 = measured; flag 0 = not
            "grad_norm": [1.0, NAN, -INF, NAN, 1.0],
            "grad_nonfinite": [0, 12, 3, NAN, 0],  # step 3: not measured at all
        }
    )
    assert f["loss__nonfinite"] == 2.0
    assert f["grad_norm__nonfinite"] == 2.0
    # infinities stay out: the mean of 2.0 and 2.5 is 2.25
    assert f["loss__last_dev"] == 0.25 and f["loss__min_dev"] == -0.25
    assert f["grad_norm__last_rel"] == 1.0


def test_all_nonfinite_window():
    f = features({"loss": [NAN] * 4, "loss_nonfinite": [1.0] * 4})
    assert f["loss__nonfinite"] == 4.0
    assert all(math.isnan(f[f"loss__{s}"]) for s in ("last_dev", "min_dev", "std", "slope"))


def test_unmeasured_signal_gives_nan_features_without_warnings():
    fx = FeatureExtractor(window=30)
    frame = pd.DataFrame({"step": np.arange(30), "loss": np.linspace(3, 2, 30)})
    frame["grad_norm"] = 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vec = dict(zip(fx.schema.names, fx.transform_window(frame), strict=True))
    assert vec["loss__last_dev"] == pytest.approx(-0.5)  # 2 against a mean of 2.5
    assert vec["grad_norm__std_rel"] == 0.0
    assert vec["ctx__steps"] == 29.0 and vec["ctx__grad_norm_over_long"] == 1.0
    absent = [n for n in vec if not n.startswith(("loss__", "grad_norm__", "ctx__"))]
    assert absent and all(math.isnan(vec[n]) for n in absent)
    assert math.isnan(vec["ctx__lr_over_peak"]) and math.isnan(vec["ctx__loss_over_early"])


def _dsi(grad_cv, attn_kl, update_cos):
    f = features({"grad_cv": grad_cv, "attn_kl": attn_kl, "update_cos": update_cos})
    return f["dsi__count"], f["dsi__all_steps"]


def test_dsi_cross_features():
    ok_cv, bad_cv = 0.3, 0.6  # threshold > 0.45
    ok_cos, bad_cos = 0.5, 0.95  # band 0.1 .. 0.9
    grad_cv = [ok_cv] * 6 + [bad_cv] * 4
    update_cos = [ok_cos] * 4 + [bad_cos] * 6
    attn_kl = [0.5] + [NAN] * 4 + [2.0] + [NAN] * 4  # measured twice; over from t=5 on
    assert _dsi(grad_cv, attn_kl, update_cos) == (3.0, 4.0)
    attn_ok = [0.5] + [NAN] * 9
    assert _dsi(grad_cv, attn_ok, update_cos) == (2.0, 0.0)
    count, steps = _dsi(grad_cv, [NAN] * 10, update_cos)  # attention unreachable
    assert count == 2.0 and math.isnan(steps)
    count, steps = _dsi([NAN] * 10, [NAN] * 10, [NAN] * 10)
    assert math.isnan(count) and math.isnan(steps)


def test_kernel_rejects_wrong_shapes():
    with pytest.raises(ValueError, match=r"\(n_windows, window >= 2, 2 signals\)"):
        window_features(np.zeros((3, 10, 3)), ("loss", "lr"))


@pytest.mark.parametrize("seed", range(4))
def test_every_feature_is_finite_or_nan_on_zero_negative_and_extreme_inputs(seed):
    # zeros (an LR warm-up from 0), negatives, non-finite values and values whose squares
    # or quotients overflow float64: a feature is never infinite (LightGBM refuses inf),
    # in the window statistics as in the run context's ratios
    from collapse_guard.signals import SIGNAL_NAMES

    rng = np.random.default_rng(seed)
    pool = np.array([0.0, -1.0, -1e300, 1e300, 5e-324, 1e-310, INF, -INF, NAN, 1.0])
    rows = 260
    frame = pd.DataFrame({"step": np.arange(rows)})
    for name in SIGNAL_NAMES:
        frame[name] = rng.choice(pool, size=rows)
    frame["lr"] = np.where(np.arange(rows) == 0, 0.0, frame["lr"])
    fx = FeatureExtractor(window=20)
    got = fx.transform_run(frame).to_numpy()
    assert not np.isinf(got).any()
    assert np.isfinite(got).sum() > 0.3 * got.size  # defined where it can be
    # the tiny best loss: loss over best would overflow; it is undefined, not inf
    tiny = pd.DataFrame({"step": np.arange(3), "loss": [1e-310, 1e-310, 1e10]})
    ctx = FeatureExtractor(window=2, signals=("loss",)).transform_run(tiny)
    assert math.isnan(ctx.loc[2, "ctx__loss_over_best"])
    assert ctx.loc[1, "ctx__loss_over_best"] == 1.0
