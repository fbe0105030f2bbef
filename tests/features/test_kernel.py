"""The compiled kernel against a plain numpy/pandas reference, and the ways a window
reaches it (alone, in a block, at any place in a grid, through the frame fast path),
which must all give the same bits."""

import math

import numpy as np
import pandas as pd
import pytest

import collapse_guard.features.extractor as extractor_module
from collapse_guard.features import FeatureExtractor, window_feature_names, window_features
from collapse_guard.features.stats import COMPANION_FLAGS, grid_features
from collapse_guard.signals import DSI_SIGNALS, signal

from .test_extractor import streaming

SIGNALS = ("loss", "lr", "grad_cv", "attn_kl", "update_cos", "host_mem_available")


def mixed_run(steps: int = 260, seed: int = 0) -> pd.DataFrame:
    """Signals measured every step, every few steps, from some step on, or never."""
    rng = np.random.default_rng(seed)
    t = np.arange(steps)
    frame = pd.DataFrame({"step": t})
    frame["loss"] = 3.0 + rng.normal(0, 0.1, steps)
    # lr: measured every step, then every 25 steps (windows hold 8..40 values), then
    # every 40 (at most 5 per window of 30)
    frame["lr"] = np.where((t < 80) | ((t < 170) & (t % 25 == 0)) | (t % 40 == 0), 1e-3, np.nan)
    frame.loc[frame["lr"].notna(), "lr"] *= 1 + rng.uniform(0, 1, int(frame["lr"].notna().sum()))
    frame["grad_cv"] = rng.uniform(0.3, 0.6, steps)
    # attn_kl: unmeasured for the first 100 steps (all-NaN windows), then every 7 steps
    frame["attn_kl"] = np.where((t >= 100) & (t % 7 == 0), rng.uniform(0, 2, steps), np.nan)
    frame["update_cos"] = rng.uniform(0.0, 1.0, steps)
    frame.loc[150:155, "update_cos"] = np.inf
    frame["host_mem_available"] = np.nan  # never measured
    return frame


def reference(frame: pd.DataFrame, signals: tuple[str, ...]) -> dict[str, float]:
    """Every window feature of the window ``frame`` (one row per step, last row "now"),
    computed the plain way, as the schema's table words it."""
    out: dict[str, float] = {}
    kept = set(window_feature_names(signals))  # the statistics of each signal's reading
    t = np.arange(len(frame), dtype=float)
    for s in signals:
        x = frame[s].to_numpy(dtype=float)
        ok = np.isfinite(x)
        v, tv = x[ok], t[ok]
        bad = np.isinf(x)
        if s in COMPANION_FLAGS and COMPANION_FLAGS[s] in signals:
            bad |= np.isnan(x) & (frame[COMPANION_FLAGS[s]].to_numpy() > 0)
        nonfinite = float(bad.sum()) if ok.any() or bad.any() else math.nan
        stats = {"nonfinite": nonfinite}
        if ok.any():
            # pandas' EWMA with gaps: weights by distance from now, renormalised
            ewm = pd.Series(np.where(ok, x, np.nan)).ewm
            short, long = ewm(span=10).mean().iloc[-1], ewm(span=100).mean().iloc[-1]
            mean, std = v.mean(), v.std()
            slope = np.polyfit(tv, v, 1)[0] if len(v) > 1 else math.nan
            stats.update(
                last=v[-1],
                mean=mean,
                std=std,
                min=v.min(),
                max=v.max(),
                slope=slope,
                ewma_ratio=short / long if long != 0 else math.nan,
                zscore=(v[-1] - mean) / std if std > 1e-12 * abs(mean) else math.nan,
                frac_over=np.mean([signal(s).over_threshold(u) for u in v]),
                # ratio reading: over the mean; shift reading: minus the mean
                **{
                    f"{k}_rel": val / mean if mean != 0 else math.nan
                    for k, val in (
                        ("last", v[-1]),
                        ("std", std),
                        ("min", v.min()),
                        ("max", v.max()),
                        ("slope", slope),
                    )
                },
                **{
                    f"{k}_dev": val - mean
                    for k, val in (("last", v[-1]), ("min", v.min()), ("max", v.max()))
                },
                ewma_dev=short - long,
            )
        # a statistic of no value (all NaN window) is NaN
        out.update(
            {n: stats.get(n.split("__")[1], math.nan) for n in kept if n.startswith(f"{s}__")}
        )
    if all(s in signals for s in DSI_SIGNALS):
        # over (1) or not (0) at each step, carried forward from the last measurement in
        # the window (pandas ffill); unknown (NaN) before the first one: "not over"
        state = pd.DataFrame(
            {
                s: pd.Series(
                    [
                        float(signal(s).over_threshold(u)) if np.isfinite(u) else np.nan
                        for u in frame[s]
                    ]
                ).ffill()
                for s in DSI_SIGNALS
            }
        ).eq(1.0)
        not_all = np.flatnonzero(~state.all(axis=1).to_numpy())
        trailing = len(frame) - 1 - not_all[-1] if len(not_all) else len(frame)
        measured = [np.isfinite(frame[s].to_numpy()).any() for s in DSI_SIGNALS]
        out["dsi__count"] = float(state.iloc[-1].sum()) if any(measured) else math.nan
        out["dsi__all_steps"] = float(trailing) if all(measured) else math.nan
    return out


def random_window(rows: int, share: float, seed: int) -> pd.DataFrame:
    """A window with ``share`` of each signal's steps measured, infinities, flagged and
    unflagged NaN losses, and values far from 0 (param_norm)."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(
        {
            "loss": rng.normal(3.0, 0.5, rows),
            "loss_nonfinite": (rng.random(rows) < 0.2).astype(float),
            "grad_norm": rng.lognormal(0, 1, rows),
            "grad_cv": rng.uniform(0.3, 0.6, rows),
            "attn_kl": rng.uniform(0.0, 2.0, rows),
            "update_cos": rng.uniform(0.0, 1.0, rows),
            "param_norm": 3e4 + rng.normal(0, 1e-2, rows),
        }
    )
    for name in frame.columns:
        if name != "loss_nonfinite":
            frame.loc[rng.random(rows) > share, name] = np.nan
    frame.loc[rng.random(rows) < 0.05, ["loss", "grad_norm"]] = np.inf
    frame.loc[rng.random(rows) < 0.05, "update_cos"] = -np.inf
    # all three DSI signals over threshold in the last 6 steps (attn_kl measured once,
    # then carried forward); odd seeds break the run 3 steps before the end
    frame.loc[rows - 6 :, ["grad_cv", "update_cos"]] = [0.7, 0.95]
    frame.loc[rows - 8 :, "attn_kl"] = [1.8] + [np.nan] * 7
    if seed % 2:
        frame.loc[rows - 3, "grad_cv"] = 0.3
    return frame


@pytest.mark.parametrize(
    ("share", "seed"), [(1.0, 0), (0.7, 1), (0.3, 2), (0.05, 3), (0.02, 4), (0.0, 5)]
)
def test_every_statistic_matches_the_reference(share, seed):
    frame = random_window(60, share, seed)
    fx = FeatureExtractor(window=60, signals=tuple(frame.columns))
    got = dict(zip(fx.schema.names, fx.transform_array(frame.to_numpy()), strict=True))
    expected = reference(frame, fx.signals)
    assert set(got) == set(expected) | set(fx.schema.context)
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=1e-9, abs=1e-12, nan_ok=True), name


@pytest.mark.parametrize("count", [1, 2, 8, 9, 30])
def test_few_or_many_values_give_the_statistics(count):
    # sparse windows (attention probes, telemetry) and dense ones, far from 0
    rng = np.random.default_rng(count)
    values = np.full(30, np.nan)
    values[np.sort(rng.choice(30, size=count, replace=False))] = 1e4 + rng.normal(0, 1, count)
    frame = pd.DataFrame({"lr": values})
    fx = FeatureExtractor(window=30, signals=("lr",))
    got = dict(zip(fx.schema.names, fx.transform_array(values[:, None]), strict=True))
    for name, value in reference(frame, fx.signals).items():
        assert got[name] == pytest.approx(value, rel=1e-9, nan_ok=True), name


@pytest.mark.parametrize("block", [3, 5, 64])
def test_blocks_equal_streaming_to_the_bit(monkeypatch, block):
    # blocks holding windows with few and many values of a signal, all-NaN windows
    # next to measured ones, and a signal never measured at all
    frame = mixed_run()
    fx = FeatureExtractor(window=30, signals=SIGNALS)
    monkeypatch.setattr(extractor_module, "_BLOCK", block)
    batch = fx.transform_run(frame, steps=frame["step"].to_numpy()).to_numpy()
    assert np.array_equal(batch, streaming(fx, frame), equal_nan=True)
    kl = dict(zip(fx.schema.names, batch[50], strict=True))
    assert np.isnan(kl["attn_kl__mean"]) and kl["update_cos__nonfinite"] == 0.0
    assert np.isnan(batch[:, list(fx.schema.names).index("host_mem_available__last_rel")]).all()


def test_a_window_does_not_depend_on_the_rest_of_the_call():
    frame = mixed_run(seed=3)
    ends = np.arange(29, len(frame))
    stack = np.stack([frame[list(SIGNALS)].to_numpy()[e - 29 : e + 1] for e in ends])
    many = window_features(stack, SIGNALS)
    pairs = np.concatenate([window_features(stack[i : i + 2], SIGNALS) for i in range(0, 231, 2)])
    one = np.concatenate([window_features(stack[i : i + 1], SIGNALS) for i in range(0, 231)])
    assert np.array_equal(many, pairs, equal_nan=True)
    assert np.array_equal(many, one, equal_nan=True)
    # overlapping windows of one grid, in any order, repeated, from a strided view
    grid = frame[list(SIGNALS)].to_numpy().T
    shuffled = np.random.default_rng(0).permutation(np.repeat(ends, 2))
    wide = np.repeat(grid, 3, axis=1)[:, ::3]
    got = grid_features(wide, shuffled, SIGNALS, 30)
    assert np.array_equal(got, many[shuffled - 29], equal_nan=True)


def test_kernel_rejects_windows_outside_the_grid():
    grid = np.zeros((2, 10))
    for ends, got in (([9, 3], "3..9"), ([4, 10], "4..10"), ([-1], "-1..-1")):
        with pytest.raises(ValueError, match=rf"columns 4..9 .*; got ends {got};"):
            grid_features(grid, ends, ("loss", "lr"), 5)
    with pytest.raises(ValueError, match=r"grid must have shape \(2 signals, span\)"):
        grid_features(np.zeros((3, 10)), [9], ("loss", "lr"), 5)


def test_frame_fast_path_matches_the_general_one():
    frame = mixed_run()
    fx = FeatureExtractor(window=30, signals=SIGNALS)
    expected = fx.transform_window(frame)
    # nullable extension dtypes and a string column take the general path
    ext = frame.astype({"loss": "Float64"}).assign(event="")
    assert np.array_equal(fx.transform_window(ext), expected, equal_nan=True)
    # only the rows a window can hold are read for the window: the tail alone gives the
    # same window features (its context is the tail's: given, it is the whole run's)
    tail = fx.transform_window(frame.iloc[-30:])
    n = len(fx.schema.names) - len(fx.schema.context)
    assert np.array_equal(tail[:n], expected[:n], equal_nan=True)
    context = dict(zip(fx.schema.context, expected[n:], strict=True))
    given = fx.transform_window(frame.iloc[-30:], context=context)
    assert np.array_equal(given, expected, equal_nan=True)
    renamed = frame.rename(columns={"lr": "not_a_signal"})  # other columns, same frame size
    got = dict(zip(fx.schema.names, fx.transform_window(renamed), strict=True))
    assert np.isnan(got["lr__last_rel"]) and not np.isnan(got["loss__std"])


def test_frame_fast_path_reports_rows_of_the_whole_frame():
    frame = pd.DataFrame({"step": [*range(300), 10], "loss": 1.0})
    with pytest.raises(ValueError, match="step 10 at row 300, smaller than step 299"):
        FeatureExtractor(signals=("loss",)).transform_window(frame)
