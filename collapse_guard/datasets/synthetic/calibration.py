"""Do synthetic runs look like real ones? Per-run statistics and a two-set comparison.

:func:`run_stats` reduces one run file to a few numbers that a predictor leans on:

=====================  ==========================================================
statistic              what (region: after the first 20% of steps, before onset)
=====================  ==========================================================
``loss_level``         median loss, nats
``loss_noise``         robust std (1.4826 x MAD) of one-step loss differences
``grad_norm_level``    median gradient norm
``attn_logit_level``   median max attention logit
``pre_loss_drift``     collapses: median loss in [onset-50, onset) minus in
                       [onset-200, onset-150), nats
``pre_entropy_drift``  collapses: the same for mean attention entropy, nats
``collapse_rise``      collapses: median finite loss in (onset+50, onset+300]
                       minus median in [onset-100, onset), nats
``onset_frac``         collapses: onset step / last step
=====================  ==========================================================

plus, over a whole set, ``collapse_share``. :func:`compare_run_sets` compares two
sets (e.g. real vs synthetic) statistic by statistic: the shift of the medians (a
ratio for levels, a difference for drifts and shares) and the two-sample
Kolmogorov-Smirnov statistic, each against a stated bound in :data:`BOUNDS` widened
by the sampling noise of the two sets (at 3 standard errors for the medians, at
``alpha`` for KS): small sets are judged only on differences they can show.

The noise is robust (MAD) on purpose: one-step data spikes and recovered spikes
are their own phenomena; a plain std would let three spikes set a run's "noise".
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from collapse_guard.datasets.runfile import RunMeta, read_run

__all__ = [
    "BOUNDS",
    "Bound",
    "CalibrationReport",
    "StatDistance",
    "compare_run_sets",
    "compare_stats",
    "ks_statistic",
    "run_stats",
    "stats_table",
]

SETTLE_FRAC = 0.2  # skip the warmup transient: the first 20% of a run's steps
MIN_RUNS = 5  # fewer runs than this on either side: the statistic is reported, not judged


@dataclass(frozen=True)
class Bound:
    """How far two sets may differ on one statistic.

    ``shift`` is "ratio" (median_b / median_a within [1/limit, limit]), "diff"
    (|median_b - median_a| <= limit) or "share" (of collapsed runs: |share_b -
    share_a| <= limit). Each limit is widened by the sets' sampling noise.
    ``max_ks``: the KS statistic may exceed the sampling noise at ``alpha`` only up
    to this (distributions of this width can differ in detail; beyond it they
    describe different runs).
    """

    shift: str
    limit: float
    max_ks: float = 0.5


# Bounds, each with its reason. Levels: the real small runs span a range (loss
# 2.0-2.8 after warmup), so a median within 25% and KS <= 0.5 says "same regime".
BOUNDS: dict[str, Bound] = {
    "loss_level": Bound("ratio", 1.25),
    # Batch noise depends on batch size and tokens per batch: a factor 2 is one knob.
    "loss_noise": Bound("ratio", 2.0),
    # Gradient-norm and logit levels depend on init and width: one order of magnitude
    # on either side would teach the predictor a scale it never sees.
    "grad_norm_level": Bound("ratio", 3.0, max_ks=0.6),
    "attn_logit_level": Bound("ratio", 3.0, max_ks=0.6),
    # Precursor drifts: what the predictor learns from. Measured drifts are tenths of
    # a nat; 0.15 nats of median shift is half the label's margin.
    "pre_loss_drift": Bound("diff", 0.15),
    "pre_entropy_drift": Bound("diff", 0.5),
    # Collapses rise 0.28-0.89 nats here: within 0.3 nats of the median.
    "collapse_rise": Bound("diff", 0.3),
    "onset_frac": Bound("diff", 0.2),
    "collapse_share": Bound("share", 0.2),  # set-level: a share, no distribution
}


def _median_in(steps: np.ndarray, values: np.ndarray, lo: float, hi: float) -> float:
    """Median of the finite values with lo <= step < hi (NaN when there are none)."""
    pick = (steps >= lo) & (steps < hi) & np.isfinite(values)
    return float(np.median(values[pick])) if pick.any() else math.nan


def run_stats(frame: pd.DataFrame, meta: RunMeta) -> dict[str, float]:
    """The statistics of one run (see the module docstring); NaN where undefined."""
    steps = frame["step"].to_numpy(dtype=np.int64)
    loss = frame["loss"].to_numpy(dtype=np.float64)
    onset = meta.onset_step
    first, last = (int(steps[0]), int(steps[-1])) if steps.size else (0, 0)
    settled = first + SETTLE_FRAC * (last - first)
    end = onset if onset is not None else last + 1
    region = (steps >= settled) & (steps < end)

    stats = {
        "loss_level": _median_in(steps, loss, settled, end),
        "grad_norm_level": _median_in(steps, frame["grad_norm"].to_numpy(float), settled, end),
        "attn_logit_level": _median_in(
            steps, frame["attn_logit_max"].to_numpy(float), settled, end
        ),
    }
    # One-step differences only between rows one step apart (gaps and sparse logs excluded).
    ok = region & np.isfinite(loss)
    idx = np.flatnonzero(ok)
    consecutive = idx[1:][(np.diff(steps[idx]) == 1)]
    diffs = loss[consecutive] - loss[consecutive - 1]
    stats["loss_noise"] = (
        float(1.4826 * np.median(np.abs(diffs - np.median(diffs))))
        if diffs.size >= 20
        else math.nan
    )

    nan = math.nan
    stats.update(pre_loss_drift=nan, pre_entropy_drift=nan, collapse_rise=nan, onset_frac=nan)
    if onset is not None:
        entropy = frame["attn_entropy_mean"].to_numpy(float)
        for name, values in (("pre_loss_drift", loss), ("pre_entropy_drift", entropy)):
            stats[name] = _median_in(steps, values, onset - 50, onset) - _median_in(
                steps, values, onset - 200, onset - 150
            )
        stats["collapse_rise"] = _median_in(steps, loss, onset + 51, onset + 301) - _median_in(
            steps, loss, onset - 100, onset
        )
        stats["onset_frac"] = (onset - first) / max(last - first, 1)
    return stats


def stats_table(paths: Iterable[str | os.PathLike]) -> pd.DataFrame:
    """One row of :func:`run_stats` per run file, plus ``collapsed`` (0/1)."""
    rows = []
    for path in paths:
        frame, meta = read_run(path)
        rows.append({**run_stats(frame, meta), "collapsed": float(meta.onset_step is not None)})
    return pd.DataFrame(rows)


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: largest gap between the two ECDFs."""
    a, b = np.sort(np.asarray(a, float)), np.sort(np.asarray(b, float))
    pooled = np.concatenate([a, b])
    cdf_a = np.searchsorted(a, pooled, side="right") / a.size
    cdf_b = np.searchsorted(b, pooled, side="right") / b.size
    return float(np.max(np.abs(cdf_a - cdf_b)))


def _ks_noise(n_a: int, n_b: int, alpha: float) -> float:
    """KS value two samples of these sizes exceed with probability ``alpha`` when equal."""
    return math.sqrt(-math.log(alpha / 2) / 2) * math.sqrt((n_a + n_b) / (n_a * n_b))


@dataclass(frozen=True)
class StatDistance:
    """One statistic compared between set A (reference) and set B."""

    name: str
    n_a: int
    n_b: int
    median_a: float
    median_b: float
    shift: float  # ratio b/a or difference b - a, per the bound
    shift_limit: float  # the bound's limit widened by the sets' sampling noise
    ks: float  # NaN for set-level statistics
    ks_limit: float
    bound: Bound
    judged: bool  # False: too few runs on a side, reported only
    passed: bool

    def line(self) -> str:
        verdict = "pass" if self.passed else "FAIL"
        if not self.judged:
            verdict = "n/a (too few runs)"
        op = "x" if self.bound.shift == "ratio" else "+"
        return (
            f"{self.name:<18} A {self.median_a:>10.4g} (n={self.n_a:<4}) B {self.median_b:>10.4g} "
            f"(n={self.n_b:<4}) shift {op}{self.shift:.3g} (limit {self.bound.limit:g}, "
            f"with noise {self.shift_limit:.3g})  "
            f"KS {self.ks:.2f} (limit {self.ks_limit:.2f})  {verdict}"
        )


@dataclass(frozen=True)
class CalibrationReport:
    distances: tuple[StatDistance, ...]

    @property
    def passed(self) -> bool:
        return all(d.passed for d in self.distances)

    @property
    def failures(self) -> list[str]:
        return [d.name for d in self.distances if not d.passed]

    def summary(self) -> str:
        head = "calibration: " + ("pass" if self.passed else f"FAIL ({', '.join(self.failures)})")
        return "\n".join([head, *(d.line() for d in self.distances)])


def _median_noise(va: np.ndarray, vb: np.ndarray) -> float:
    """3 standard errors of a difference of medians (robust pooled spread)."""
    pooled = np.concatenate([va, vb])
    sigma = 1.4826 * float(np.median(np.abs(pooled - np.median(pooled))))
    return 3 * 1.2533 * sigma * math.sqrt(1 / va.size + 1 / vb.size)


def _shift(bound: Bound, va: np.ndarray, vb: np.ndarray) -> tuple[float, float, float, float]:
    """``(median_a, median_b, shift, allowed)``; allowed is in the shift's own units."""
    if bound.shift == "ratio":
        med_a, med_b = float(np.median(va)), float(np.median(vb))
        if not (med_a > 0 and med_b > 0 and (va > 0).all() and (vb > 0).all()):
            return med_a, med_b, math.nan, math.nan
        noise = _median_noise(np.log(va), np.log(vb))
        return med_a, med_b, med_b / med_a, bound.limit * math.exp(noise)
    if bound.shift == "share":
        med_a, med_b = float(va.mean()), float(vb.mean())
        p = (va.sum() + vb.sum()) / (va.size + vb.size)
        noise = 3 * math.sqrt(p * (1 - p) * (1 / va.size + 1 / vb.size))
        return med_a, med_b, med_b - med_a, bound.limit + noise
    med_a, med_b = float(np.median(va)), float(np.median(vb))
    return med_a, med_b, med_b - med_a, bound.limit + _median_noise(va, vb)


def _shift_ok(bound: Bound, shift: float, allowed: float) -> bool:
    if bound.shift == "ratio":
        return 1 / allowed <= shift <= allowed  # False for NaN
    return abs(shift) <= allowed


def compare_stats(
    a: pd.DataFrame,
    b: pd.DataFrame,
    bounds: Mapping[str, Bound] = BOUNDS,
    *,
    alpha: float = 1e-3,
) -> CalibrationReport:
    """Compare two :func:`stats_table` frames, A the reference (real), B the candidate."""
    out = []
    for name, bound in bounds.items():
        column = "collapsed" if bound.shift == "share" else name
        va, vb = a[column].to_numpy(float), b[column].to_numpy(float)
        va, vb = va[np.isfinite(va)], vb[np.isfinite(vb)]
        if min(va.size, vb.size) < MIN_RUNS:
            med_a = float(np.median(va)) if va.size else math.nan
            med_b = float(np.median(vb)) if vb.size else math.nan
            nan = math.nan
            out.append(
                StatDistance(
                    name, va.size, vb.size, med_a, med_b, nan, nan, nan, nan, bound, False, True
                )
            )
            continue
        med_a, med_b, shift, allowed = _shift(bound, va, vb)
        ks, ks_limit, ks_ok = math.nan, math.nan, True
        if bound.shift != "share":
            ks = ks_statistic(va, vb)
            ks_limit = max(bound.max_ks, _ks_noise(va.size, vb.size, alpha))
            ks_ok = ks <= ks_limit
        passed = _shift_ok(bound, shift, allowed) and ks_ok
        out.append(
            StatDistance(
                name,
                va.size,
                vb.size,
                med_a,
                med_b,
                shift,
                allowed,
                ks,
                ks_limit,
                bound,
                True,
                passed,
            )
        )
    return CalibrationReport(tuple(out))


def compare_run_sets(
    reference: Iterable[str | os.PathLike],
    candidate: Iterable[str | os.PathLike],
    bounds: Mapping[str, Bound] = BOUNDS,
    *,
    alpha: float = 1e-3,
) -> CalibrationReport:
    """Compare two sets of run files (e.g. real = reference, synthetic = candidate)."""
    return compare_stats(stats_table(reference), stats_table(candidate), bounds, alpha=alpha)
