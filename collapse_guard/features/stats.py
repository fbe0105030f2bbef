"""The one feature kernel: windows of a step grid -> a stack of feature vectors.

Every caller (one streaming window in the guard or the service, thousands of windows
of a run for training) goes through :func:`grid_features`, so online and offline
features cannot drift apart. Its input is a dense step grid ``(n_signals, span)`` (see
:mod:`collapse_guard.features.windows`) and the grid positions where windows end: one
window on a ``window``-column grid when streaming, every stride-th window of a block
of a run in batch. The statistics are those of the table in
:mod:`collapse_guard.features.schema`.

Input convention, as in run files: NaN = not measured at that step; ``inf``/``-inf`` =
measured non-finite. A NaN ``loss`` whose ``loss_nonfinite`` flag is 1 (or a NaN
``grad_norm`` whose ``grad_nonfinite`` count is > 0) was measured too and counts in
``__nonfinite`` (only when the flag column is among the signals).

How it works: one compiled loop (numba) visits each (window, signal) in turn, finds
the window's last finite value and computes every statistic in one pass over that
window's own ``window`` values, in a fixed order (the statistics of every reading,
:mod:`collapse_guard.features.readings`: the plan's columns keep those of the signal's
reading); the DSI features take one more pass over the window's three DSI rows. The run
context is not a window's and has its own accumulator
(:mod:`collapse_guard.features.context_kernel`). Sums are taken of ``y = value - last``
(shift by the last value: sums of squares stay accurate for values far from 0, such as
parameter norms or bytes of memory, and a constant window gives a std of exactly 0).

Why numba rather than numpy:

- streaming == batch to the bit, by construction: a window's features come from the
  same machine code reading the same values in the same order, whatever else is in
  the call (one window when streaming, hundreds in batch). It is compiled without
  ``fastmath``, so the compiler may not reorder, fuse or vectorise floating-point
  sums; numpy needed careful layouts and a sparse/dense split for the same guarantee;
- per-call cost: one streaming window is one call into compiled code instead of about
  130 numpy calls on small arrays (~1-2 µs of overhead each).

The kernel is compiled on its first call (a few seconds) and the machine code cached
(``cache=True``) in ``__pycache__`` next to this file, or numba's user cache directory
when that is not writable: later processes load it instead (numba's set-up, about a
second, is paid once per process either way). ``error_model="numpy"`` makes a
division by zero give inf/NaN instead of raising.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numba
import numpy as np

from collapse_guard.features.schema import ALL_STATS, has_dsi, window_feature_names
from collapse_guard.signals import DSI_SIGNALS, signal

__all__ = [
    "COMPANION_FLAGS",
    "EWMA_LONG_SPAN",
    "EWMA_SHORT_SPAN",
    "grid_features",
    "window_features",
]

# Spans in steps, pandas convention alpha = 2 / (span + 1): the short one follows the
# last ~10 steps, the long one the bulk of a 200-step window.
EWMA_SHORT_SPAN = 10
EWMA_LONG_SPAN = 100

# A NaN in these signals was measured (non-finite) when the flag column is > 0.
COMPANION_FLAGS: dict[str, str] = {"loss": "loss_nonfinite", "grad_norm": "grad_nonfinite"}

# A standard deviation this small relative to the mean is rounding noise of a constant
# window (e.g. a constant LR), not spread: the z-score is then undefined (NaN).
_STD_REL_FLOOR = 1e-12

# The compiled functions' options: no fastmath (floating-point order is the source
# order, the same in every call), numpy's division semantics, machine code cached.
_JIT = {"cache": True, "error_model": "numpy"}


@dataclass(frozen=True)
class _Plan:
    """Everything about the feature layout that depends only on (signals, window), as
    the arrays the compiled kernel takes."""

    n_signals: int
    n_features: int
    # (2, window): short and long EWMA weights by position in the window (1 at "now")
    weights: np.ndarray
    # (2, n_signals): seed thresholds low, high; -inf / +inf where none
    bounds: np.ndarray
    # (n_signals,): row of the signal's companion flag (COMPANION_FLAGS), -1 where none
    companion: np.ndarray
    # (n_signals, len(ALL_STATS)): output column of each statistic, -1 where the
    # signal's reading does not have it (schema.READING_STATS) or it has no threshold
    columns: np.ndarray
    # rows of grad_cv, attn_kl, update_cos, then the columns of dsi__count and
    # dsi__all_steps; empty when the signals lack one of the three
    dsi: np.ndarray


def _ewma_weights(window: int, span: int) -> np.ndarray:
    alpha = 2.0 / (span + 1.0)
    return (1.0 - alpha) ** np.arange(window - 1, -1, -1, dtype=np.float64)


@lru_cache(maxsize=32)
def _plan(signals: tuple[str, ...], window: int) -> _Plan:
    names = window_feature_names(signals)
    where = {name: i for i, name in enumerate(names)}
    dsi: list[int] = []
    if has_dsi(signals):
        dsi = [signals.index(s) for s in DSI_SIGNALS]
        dsi += [where["dsi__count"], where["dsi__all_steps"]]
    flags = {s: signals.index(f) for s, f in COMPANION_FLAGS.items() if f in signals}
    low = [signal(s).low for s in signals]
    high = [signal(s).high for s in signals]
    return _Plan(
        n_signals=len(signals),
        n_features=len(names),
        weights=np.stack(
            [_ewma_weights(window, EWMA_SHORT_SPAN), _ewma_weights(window, EWMA_LONG_SPAN)]
        ),
        bounds=np.array(
            [
                [-np.inf if v is None else v for v in low],
                [np.inf if v is None else v for v in high],
            ],
            dtype=np.float64,
        ),
        companion=np.array([flags.get(s, -1) for s in signals], dtype=np.int64),
        columns=np.array(
            [[where.get(f"{s}__{stat}", -1) for stat in ALL_STATS] for s in signals],
            dtype=np.int64,
        ).reshape(len(signals), len(ALL_STATS)),  # 2-D even without signals
        dsi=np.array(dsi, dtype=np.int64),
    )


def window_features(windows: np.ndarray, signals: Sequence[str]) -> np.ndarray:
    """Features of a stack of windows.

    Args:
        windows: ``(n_windows, window, n_signals)`` float array (any strides); the
            last row of each window is "now"; NaN = not measured, inf = measured
            non-finite.
        signals: the signal name of each of the ``n_signals`` columns.

    Returns:
        ``(n_windows, n_features)`` float64, columns in ``window_feature_names(signals)``
        order (the window's features; the run context is not a window's).
    """
    windows = np.asarray(windows, dtype=np.float64)
    signals = tuple(signals)
    if windows.ndim != 3 or windows.shape[2] != len(signals) or windows.shape[1] < 2:
        raise ValueError(
            f"windows must have shape (n_windows, window >= 2, {len(signals)} signals); "
            f"got {windows.shape}; stack windows as np.stack([w1, w2, ...]) with one "
            "column per signal"
        )
    n, window, n_signals = windows.shape
    # the windows side by side on one grid: window i ends at column (i + 1) * window - 1
    grid = windows.transpose(2, 0, 1).reshape(n_signals, n * window)
    return grid_features(grid, np.arange(1, n + 1) * window - 1, signals, window)


def grid_features(
    grid: np.ndarray, ends: np.ndarray | Sequence[int], signals: Sequence[str], window: int
) -> np.ndarray:
    """Features of the windows of a step grid.

    Args:
        grid: ``(n_signals, span)`` float64 values, one column per step (any strides;
            never written to).
        ends: column of "now" of each window (integers ``window - 1 .. span - 1``);
            window ``i`` covers columns ``ends[i] - window + 1 .. ends[i]``.
        signals: the signal name of each row of ``grid``.
        window: steps per window (>= 2).

    Returns:
        ``(len(ends), n_features)`` float64, columns in ``window_feature_names(signals)``
        order.
    """
    plan = _plan(tuple(signals), int(window))
    # Always C-contiguous float64 and int64, as the plan's arrays: numba compiles one
    # specialisation of the kernel, and every caller runs that same machine code.
    grid = np.ascontiguousarray(grid, dtype=np.float64)
    if grid.ndim != 2 or grid.shape[0] != plan.n_signals:
        raise ValueError(
            f"grid must have shape ({plan.n_signals} signals, span); got {grid.shape}; "
            "build it with windows.dense_grid, one row per signal"
        )
    ends = np.ascontiguousarray(ends, dtype=np.int64)
    try:
        return _kernel(
            grid,
            ends,
            plan.weights,
            plan.bounds,
            plan.companion,
            plan.columns,
            plan.dsi,
            plan.n_features,
        )
    except IndexError:  # the kernel only checks; the numbers are put in the message here
        raise ValueError(
            f"window ends must be grid columns {window - 1}..{grid.shape[1] - 1} (window - 1 "
            f"to span - 1); got ends {ends.min()}..{ends.max()}; pass the column of each "
            "window's last step"
        ) from None


@numba.njit(**_JIT)
def _kernel(grid, ends, weights, bounds, companion, columns, dsi, n_features):
    """``(len(ends), n_features)``: each window's statistics, one (window, signal) at a
    time, then its DSI features. Arguments are those of :class:`_Plan`."""
    n_signals, span = grid.shape
    window = weights.shape[1]
    out = np.empty((len(ends), n_features))
    for i in range(len(ends)):
        end = ends[i]
        if end < window - 1 or end >= span:
            # indexing is unchecked below: it would read outside the grid
            raise IndexError("a window end lies outside the grid")
        start = end - window + 1
        for s in range(n_signals):
            x = grid[s, start : end + 1]
            # without a companion flag a NaN is never measured: the window's values stand
            # in for the flags (NaN > 0 is false)
            flag = grid[companion[s], start : end + 1] if companion[s] >= 0 else x
            stats = _signal_stats(x, flag, weights, bounds[0, s], bounds[1, s])
            for k in range(len(stats)):
                if columns[s, k] >= 0:
                    out[i, columns[s, k]] = _defined(stats[k])
        if len(dsi):
            count, all_steps = _dsi(grid, start, window, dsi[:3], bounds)
            out[i, dsi[3]] = count
            out[i, dsi[4]] = all_steps
    return out


@numba.njit(**_JIT)
def _signal_stats(x, flag, weights, low, high):
    """The statistics of one signal's window ``x``, in ``schema.ALL_STATS`` order: every
    reading's, as the schema lists them (the plan's columns pick a signal's reading's
    ones; tests/features/test_kernel.py checks each by name against a reference)."""
    # "now" is the last finite value; sums are of y = value - last
    j = len(x) - 1
    while j >= 0 and not math.isfinite(x[j]):
        j -= 1
    shift = x[j] if j >= 0 else 0.0
    count = n_bad = n_over = 0
    # sums of the positions k (the regression's abscissa) are integers: exact, and
    # cheaper than one more chain of float additions
    s_t = s_tt = 0
    s_y = s_yy = s_ty = s_ws = s_wl = s_wsy = s_wly = 0.0
    lo, hi = math.inf, -math.inf
    for k in range(len(x)):
        v = x[k]
        if math.isfinite(v):
            count += 1
            y = v - shift
            s_y += y
            s_yy += y * y
            s_t += k
            s_tt += k * k
            s_ty += k * y
            # EWMA weights summed over the values present: gaps do not bias the mean
            s_ws += weights[0, k]
            s_wl += weights[1, k]
            s_wsy += weights[0, k] * y
            s_wly += weights[1, k] * y
            lo = min(lo, v)
            hi = max(hi, v)
            if v < low or v > high:
                n_over += 1
        elif math.isinf(v) or flag[k] > 0:
            n_bad += 1
    nan = math.nan
    if count == 0:  # every statistic of values is NaN; a count of 0 would read "measured"
        bad = float(n_bad) if n_bad else nan
        return (
            *(nan, nan, nan, nan, nan, nan, nan, nan, nan, bad),
            *(nan, nan, nan, nan, nan, nan, nan, nan, nan),
        )
    n = float(count)
    m1 = s_y / n
    mean = shift + m1
    var = s_yy / n - m1 * m1
    std = 0.0 if var < 0.0 else math.sqrt(var)  # rounding can take it below 0; NaN stays
    slope = nan
    if count >= 2:
        # least squares over the finite points: sum (t - tm)(y - ym) / sum (t - tm)^2
        t_mean = s_t / n
        slope = (s_ty - t_mean * m1 * n) / (s_tt - s_t * t_mean)
    short_y, long_y = s_wsy / s_ws, s_wly / s_wl
    short, long = shift + short_y, shift + long_y
    ratio = _over(short, long)
    zscore = _over(-m1, std) if std > _STD_REL_FLOOR * abs(mean) else nan
    # the ratio reading: each level over the window's mean (scale-free); the shift
    # reading: each level minus it, from the shifted sums (no cancellation of levels)
    return (
        shift,
        mean,
        std,
        lo,
        hi,
        slope,
        ratio,
        zscore,
        n_over / n,
        float(n_bad),
        _over(shift, mean),
        _over(std, mean),
        _over(lo, mean),
        _over(hi, mean),
        _over(slope, mean),
        -m1,
        (lo - shift) - m1,
        (hi - shift) - m1,
        short_y - long_y,
    )


@numba.njit(**_JIT)
def _over(a, b):
    """``a / b``, NaN when ``b`` is 0 (a ratio to a zero mean is undefined, not inf) or the
    quotient overflows (a mean of 1e-310)."""
    return _defined(a / b) if b != 0.0 else math.nan


@numba.njit(**_JIT)
def _defined(v):
    """``v``, or NaN when it is infinite: a statistic that overflows float64 (the square
    of a value near 1e300) is undefined, and a feature is never infinite (LightGBM and
    scikit-learn refuse inf; NaN is "missing")."""
    return math.nan if math.isinf(v) else v


@numba.njit(**_JIT)
def _dsi(grid, start, window, rows, bounds):
    """``(dsi__count, dsi__all_steps)`` of the window starting at column ``start``.

    Between measurements a signal keeps the state of its last measurement inside the
    window (attn_kl is measured every 50 steps); before its first one it is unknown,
    which counts as "not over".
    """
    low, high = bounds[0], bounds[1]
    a, b, c = rows[0], rows[1], rows[2]
    over_a = over_b = over_c = seen_a = seen_b = seen_c = False
    trailing = 0  # steps in a row, up to the current one, with all three over
    for k in range(start, start + window):
        over_a, seen_a = _carry(grid[a, k], low[a], high[a], over_a, seen_a)
        over_b, seen_b = _carry(grid[b, k], low[b], high[b], over_b, seen_b)
        over_c, seen_c = _carry(grid[c, k], low[c], high[c], over_c, seen_c)
        trailing = trailing + 1 if over_a and over_b and over_c else 0
    count = float(over_a + over_b + over_c) if seen_a or seen_b or seen_c else math.nan
    return count, float(trailing) if seen_a and seen_b and seen_c else math.nan


@numba.njit(**_JIT)
def _carry(v, low, high, over, seen):
    """``(over, seen)`` of a signal after value ``v``: a measurement sets both, a gap
    keeps them."""
    if math.isfinite(v):
        return v < low or v > high, True
    return over, seen
