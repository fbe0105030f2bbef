"""The kernel's internal paths: dense vs sparse sums, unmeasured signals, few vs many
windows, prefix sums vs per-window sums, and the frame fast path. Each must give the
same bits whichever way a window reaches it, and the statistics of the table."""

import numpy as np
import pandas as pd
import pytest

import collapse_guard.features.extractor as extractor_module
import collapse_guard.features.stats as stats_module
from collapse_guard.features import FeatureExtractor, window_features
from collapse_guard.features.stats import SPARSE_MAX

from .test_extractor import streaming

SIGNALS = ("loss", "lr", "grad_cv", "attn_kl", "update_cos", "host_mem_available")


def mixed_run(steps: int = 260, seed: int = 0) -> pd.DataFrame:
    """Signals whose windows cross the sparse/dense boundary and the all-NaN one."""
    rng = np.random.default_rng(seed)
    t = np.arange(steps)
    frame = pd.DataFrame({"step": t})
    frame["loss"] = 3.0 + rng.normal(0, 0.1, steps)
    # lr: measured every step, then every 25 steps (windows hold 8..40 values), then
    # every 40 (at most 5 per window of 30: sparse)
    frame["lr"] = np.where((t < 80) | ((t < 170) & (t % 25 == 0)) | (t % 40 == 0), 1e-3, np.nan)
    frame.loc[frame["lr"].notna(), "lr"] *= 1 + rng.uniform(0, 1, int(frame["lr"].notna().sum()))
    frame["grad_cv"] = rng.uniform(0.3, 0.6, steps)
    # attn_kl: unmeasured for the first 100 steps (all-NaN windows), then every 7 steps
    frame["attn_kl"] = np.where((t >= 100) & (t % 7 == 0), rng.uniform(0, 2, steps), np.nan)
    frame["update_cos"] = rng.uniform(0.0, 1.0, steps)
    frame.loc[150:155, "update_cos"] = np.inf
    frame["host_mem_available"] = np.nan  # never measured
    return frame


def reference(window: np.ndarray) -> dict[str, float]:
    """Plain-numpy statistics of one signal's window (NaN = gap), as the schema says."""
    t = np.arange(len(window), dtype=float)
    ok = np.isfinite(window)
    v, tv = window[ok], t[ok]
    ws = (1 - 2 / 11) ** (len(window) - 1 - tv)
    wl = (1 - 2 / 101) ** (len(window) - 1 - tv)
    return {
        "mean": v.mean(),
        "std": v.std(),
        "min": v.min(),
        "max": v.max(),
        "slope": np.polyfit(tv, v, 1)[0] if len(v) > 1 else np.nan,
        "ewma_ratio": (ws @ v / ws.sum()) / (wl @ v / wl.sum()),
    }


@pytest.mark.parametrize("count", [2, SPARSE_MAX, SPARSE_MAX + 1, 30])
def test_sparse_and_dense_paths_give_the_statistics(count):
    # the same kind of window with a count on either side of SPARSE_MAX
    rng = np.random.default_rng(count)
    window = np.full(30, np.nan)
    where = np.sort(rng.choice(30, size=count, replace=False))
    window[where] = 1e4 + rng.normal(0, 1, count)
    fx = FeatureExtractor(window=30, signals=("lr",))
    got = dict(zip(fx.schema.names, fx.transform_array(window[:, None]), strict=True))
    for stat, value in reference(window).items():
        assert got[f"lr__{stat}"] == pytest.approx(value, rel=1e-9, nan_ok=True), stat


def test_sparse_path_equals_dense_path_to_rounding(monkeypatch):
    # every window of a run through the sparse path where it has <= SPARSE_MAX values,
    # then every window through the dense path: the same statistics to rounding
    frame = mixed_run(seed=7)
    fx = FeatureExtractor(window=30, signals=SIGNALS)
    mixed = fx.transform_run(frame).to_numpy()
    monkeypatch.setattr(stats_module, "SPARSE_MAX", 0)  # any measured window is dense
    monkeypatch.setattr(stats_module, "_FEW", 0)
    dense = fx.transform_run(frame).to_numpy()
    assert np.array_equal(np.isnan(mixed), np.isnan(dense))
    ok = ~np.isnan(mixed)
    assert mixed[ok] == pytest.approx(dense[ok], rel=1e-12, abs=1e-300)


@pytest.mark.parametrize("block", [3, 5, 64])
def test_mixed_blocks_equal_streaming_to_the_bit(monkeypatch, block):
    # blocks where a signal is sparse in some windows and dense in others, all-NaN in
    # some windows and measured in others, and never measured at all
    frame = mixed_run()
    fx = FeatureExtractor(window=30, signals=SIGNALS)
    monkeypatch.setattr(extractor_module, "_BLOCK", block)
    batch = fx.transform_run(frame, steps=frame["step"].to_numpy()).to_numpy()
    assert np.array_equal(batch, streaming(fx, frame), equal_nan=True)
    counts = frame["lr"].notna().rolling(30, min_periods=1).sum()
    assert (counts <= SPARSE_MAX).any() and (counts > SPARSE_MAX).any()
    kl = dict(zip(fx.schema.names, batch[50], strict=True))
    assert np.isnan(kl["attn_kl__mean"]) and kl["update_cos__nonfinite"] == 0.0
    assert np.isnan(batch[:, list(fx.schema.names).index("host_mem_available__mean")]).all()


def test_few_and_many_windows_agree_to_the_bit(monkeypatch):
    frame = mixed_run(seed=3)
    ends = np.arange(29, len(frame))
    stack = np.stack([frame[list(SIGNALS)].to_numpy()[e - 29 : e + 1] for e in ends])
    many = window_features(stack, SIGNALS)  # sorted into dense / sparse / unmeasured
    few = np.concatenate([window_features(stack[i : i + 2], SIGNALS) for i in range(0, 231, 2)])
    assert np.array_equal(many, few, equal_nan=True)
    monkeypatch.setattr(stats_module, "_FEW", 0)  # one window alone, sorted too
    one = np.concatenate([window_features(stack[i : i + 1], SIGNALS) for i in range(0, 231)])
    assert np.array_equal(many, one, equal_nan=True)


def test_frame_fast_path_matches_the_general_one():
    frame = mixed_run()
    fx = FeatureExtractor(window=30, signals=SIGNALS)
    expected = fx.transform_window(frame)
    # nullable extension dtypes and a string column take the general path
    ext = frame.astype({"loss": "Float64"}).assign(event="")
    assert np.array_equal(fx.transform_window(ext), expected, equal_nan=True)
    # only the rows a window can hold are read: the tail alone gives the same vector
    assert np.array_equal(fx.transform_window(frame.iloc[-30:]), expected, equal_nan=True)
    renamed = frame.rename(columns={"lr": "not_a_signal"})  # other columns, same frame size
    got = dict(zip(fx.schema.names, fx.transform_window(renamed), strict=True))
    assert np.isnan(got["lr__mean"]) and not np.isnan(got["loss__mean"])


def test_frame_fast_path_reports_rows_of_the_whole_frame():
    frame = pd.DataFrame({"step": [*range(300), 10], "loss": 1.0})
    with pytest.raises(ValueError, match="step 10 at row 300, smaller than step 299"):
        FeatureExtractor(signals=("loss",)).transform_window(frame)
