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

How the work is split (all of it vectorised over windows and signals):

- exact quantities (counts, the last value, sums of positions, non-finite and
  over-threshold counts, the DSI features) come from integer prefix sums and
  running max/min indices over the grid, so each grid step is touched a few times
  however many windows overlap it;
- floating-point sums (of ``y = value - last``, ``y^2``, ``y * t``, ``y * ewma weight``)
  need each window's own values. A (window, signal) with more than
  :data:`SPARSE_MAX` finite values takes the *dense* path: its ``window`` values,
  gaps set to 0, summed along the last axis of a ``(rows, window)`` array. One with
  1..``SPARSE_MAX`` values (attention probes every 50 steps, telemetry every 100,
  the first steps of a run) takes the *sparse* path: its finite values are gathered
  into a ``(rows, SPARSE_MAX)`` array, zero-padded, and summed the same way. A
  signal with no finite value in a block costs nothing beyond the prefix sums.

Bit-equality between streaming and batch rests on three facts, all tested: the path
of a (window, signal) depends only on that window's count of finite values; every
floating-point sum runs along the last axis of a C-contiguous array the kernel
allocates, one row per (window, signal), so a row's sum sees the same values in the
same order whatever else is in the block (numpy reduces each row on its own); and no
BLAS call is used (matrix products may block differently for different sizes). The
two paths agree to rounding (about 1e-16 relative), not to the bit, which is why
the choice between them must not depend on the rest of the block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from collapse_guard.features.schema import SIGNAL_STATS, feature_names, has_dsi
from collapse_guard.signals import DSI_SIGNALS, signal

__all__ = [
    "COMPANION_FLAGS",
    "EWMA_LONG_SPAN",
    "EWMA_SHORT_SPAN",
    "SPARSE_MAX",
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

# Windows with at most this many finite values of a signal take the gathered (sparse)
# path: 4 attention probes (every 50 steps) or 2 telemetry reads (every 100) in a
# 200-step window. A constant of the layout: changing it moves the last bit of sums.
SPARSE_MAX = 8

# Grid columns per kernel call at most: the prefix sum of squared positions stays far
# below 2^63. window_features() stacks this many windows per call.
_SPAN_LIMIT = 1 << 20
# Up to this many windows per call, both float paths run over every signal instead of
# sorting signals into dense / sparse / unmeasured first (fewer numpy calls).
_FEW = 4
_CHUNK = 256


# Per-signal statistics in the kernel's result array, in this order (frac_over, for
# thresholded signals only, is kept apart).
_STATS = tuple(s for s in SIGNAL_STATS if s != "frac_over")
_LAST, _MEAN, _STD, _MIN, _MAX, _SLOPE, _EWMA, _ZSCORE, _NONFINITE = range(len(_STATS))


@dataclass(frozen=True)
class _Plan:
    """Everything about the feature layout that depends only on (signals, window)."""

    window: int
    n_features: int
    rows: np.ndarray  # (n_signals, 1): row index of each signal, for fancy indexing
    # (4, W) weights by position t in the window: t (the regression abscissa), the
    # short and long EWMA weights (by distance from "now"), t^2
    weights: np.ndarray
    full: np.ndarray  # (4, 1): their sums over a fully measured window
    padded: np.ndarray  # (4, W + 1): weights and a column of zeros (position W: none)
    companions: tuple[tuple[int, int], ...]  # (signal index, flag index)
    thr_idx: np.ndarray  # indices of signals with a seed threshold
    low: np.ndarray  # (k, 1); -inf where no lower threshold
    high: np.ndarray  # (k, 1); +inf where no upper threshold
    dsi_idx: np.ndarray | None  # indices of grad_cv, attn_kl, update_cos
    dsi_thr: np.ndarray | None  # their positions inside thr_idx
    stat_columns: np.ndarray  # output column of each (stat in _STATS, signal), flattened
    frac_columns: np.ndarray  # output column of frac_over of each thresholded signal
    dsi_columns: tuple[int, int] | None  # dsi__count, dsi__all_steps


def _ewma_weights(window: int, span: int) -> np.ndarray:
    alpha = 2.0 / (span + 1.0)
    return (1.0 - alpha) ** np.arange(window - 1, -1, -1, dtype=np.float64)


@lru_cache(maxsize=32)
def _plan(signals: tuple[str, ...], window: int) -> _Plan:
    names = feature_names(signals)
    where = {name: i for i, name in enumerate(names)}
    thr = [i for i, s in enumerate(signals) if signal(s).has_threshold]
    dsi_idx, dsi_thr, dsi_columns = None, None, None
    if has_dsi(signals):
        dsi_idx = np.array([signals.index(s) for s in DSI_SIGNALS], dtype=np.intp)
        dsi_thr = np.array([thr.index(i) for i in dsi_idx], dtype=np.intp)
        dsi_columns = (where["dsi__count"], where["dsi__all_steps"])
    lows = [signal(signals[i]).low for i in thr]
    highs = [signal(signals[i]).high for i in thr]
    t = np.arange(window, dtype=np.float64)
    weights = np.stack(
        [t, _ewma_weights(window, EWMA_SHORT_SPAN), _ewma_weights(window, EWMA_LONG_SPAN), t * t]
    )
    return _Plan(
        window=window,
        n_features=len(names),
        rows=np.arange(len(signals))[:, None],
        weights=weights,
        # summed as the dense path sums a partial window's mask: a full window is not a
        # special case
        full=np.einsum("mw,kw->km", np.ones((1, window)), weights),
        padded=np.concatenate([weights, np.zeros((4, 1))], axis=1),
        companions=tuple(
            (signals.index(s), signals.index(f))
            for s, f in COMPANION_FLAGS.items()
            if s in signals and f in signals
        ),
        thr_idx=np.array(thr, dtype=np.intp),
        low=np.array([-np.inf if v is None else v for v in lows], dtype=np.float64)[:, None],
        high=np.array([np.inf if v is None else v for v in highs], dtype=np.float64)[:, None],
        dsi_idx=dsi_idx,
        dsi_thr=dsi_thr,
        stat_columns=np.array(
            [where[f"{s}__{stat}"] for stat in _STATS for s in signals], dtype=np.intp
        ),
        frac_columns=np.array([where[f"{signals[i]}__frac_over"] for i in thr], dtype=np.intp),
        dsi_columns=dsi_columns,
    )


def window_features(windows: np.ndarray, signals: Sequence[str]) -> np.ndarray:
    """Features of a stack of windows.

    Args:
        windows: ``(n_windows, window, n_signals)`` float array (any strides); the
            last row of each window is "now"; NaN = not measured, inf = measured
            non-finite.
        signals: the signal name of each of the ``n_signals`` columns.

    Returns:
        ``(n_windows, n_features)`` float64, columns in ``feature_names(signals)`` order.
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
    out = np.empty((n, _plan(signals, window).n_features), dtype=np.float64)
    chunk = max(1, min(_CHUNK, _SPAN_LIMIT // window))
    for a in range(0, n, chunk):
        part = windows[a : a + chunk]
        # the windows side by side on one grid: window i ends at column (i + 1) * window - 1
        grid = part.transpose(2, 0, 1).reshape(n_signals, len(part) * window)
        ends = np.arange(1, len(part) + 1) * window - 1
        out[a : a + len(part)] = grid_features(grid, ends, signals, window)
    return out


def grid_features(
    grid: np.ndarray, ends: np.ndarray, signals: Sequence[str], window: int
) -> np.ndarray:
    """Features of the windows of a step grid.

    Args:
        grid: ``(n_signals, span)`` float64 values, one column per step (any strides;
            never written to).
        ends: column of "now" of each window (integers ``>= window - 1``); window ``i``
            covers columns ``ends[i] - window + 1 .. ends[i]``.
        signals: the signal name of each row of ``grid``.
        window: steps per window (>= 2).

    Returns:
        ``(len(ends), n_features)`` float64, columns in ``feature_names(signals)`` order.
    """
    plan = _plan(tuple(signals), int(window))
    ends = np.asarray(ends, dtype=np.intp)
    if grid.shape[1] > _SPAN_LIMIT:
        raise ValueError(
            f"grid spans {grid.shape[1]} steps; at most {_SPAN_LIMIT} per call (the integer "
            "prefix sums must not overflow); split the window ends into blocks"
        )
    # All-NaN windows are normal (signals not measured): keep numpy quiet about them.
    with np.errstate(all="ignore"):
        return _kernel(grid, ends, plan)


def _kernel(grid: np.ndarray, ends: np.ndarray, plan: _Plan) -> np.ndarray:
    """Only exact operations (masks, integer sums, indexing, elementwise arithmetic)
    touch ``grid``; every floating-point sum runs on a C-contiguous array this
    function allocates, one row per (window, signal). Internal arrays are
    ``(n_signals, n_windows)``; the output is transposed at the end.
    """
    n_sig, span = grid.shape
    n = len(ends)
    window = plan.window
    starts = ends - (window - 1)
    # Windows that tile the grid (one streaming window, one window per frame) are
    # reduced one by one; overlapping windows of a run share prefix sums instead. Both
    # give the same integers.
    tiled = span == n * window and (n == 1 or (np.diff(ends) == window).all())
    marks = _marks(grid, plan)  # finite, measured non-finite, over threshold
    finite = marks[:n_sig]
    counts = _window_sums(marks, starts, ends, window, tiled)
    cnt, n_bad, n_over = counts[:n_sig], counts[n_sig : 2 * n_sig], counts[2 * n_sig :]
    none = cnt == 0

    res = np.empty((len(_STATS), n_sig, n), dtype=np.float64)
    last = res[_LAST]
    last[...] = grid[plan.rows, _last_finite(finite, ends, window, tiled)]
    # Shift by the last value: sums of squares stay accurate for values far from 0
    # (parameter norms, bytes of memory), and a constant window gives std exactly 0.
    shift = np.where(none, 0.0, last)
    extremes = res[_MIN : _MAX + 1]
    sums = _float_sums(grid, finite, cnt, shift, starts, extremes, plan)
    s_y, s_t, s_ws, s_wl, s_tt, s_yy, s_ty, s_wsy, s_wly = sums

    cntf = cnt.astype(np.float64)
    m1 = s_y / cntf
    np.add(shift, m1, out=res[_MEAN])
    std = res[_STD]
    np.sqrt(np.maximum(s_yy / cntf - m1 * m1, 0.0), out=std)
    # least squares over the finite points: sum (t - tm)(y - ym) / sum (t - tm)^2
    t_mean = s_t / cntf
    sxy = s_ty - t_mean * m1 * cntf
    sxx = s_tt - s_t * t_mean
    np.divide(sxy, sxx, out=res[_SLOPE])
    res[_SLOPE][cnt < 2] = np.nan
    # each EWMA is a weighted mean of the finite values, weights decaying with the
    # distance from "now", renormalised over the values present (gaps do not bias it)
    short = shift + s_wsy / s_ws
    long = shift + s_wly / s_wl
    np.divide(short, long, out=res[_EWMA])
    res[_EWMA][long == 0.0] = np.nan
    np.divide(-m1, std, out=res[_ZSCORE])
    res[_ZSCORE][~(std > _STD_REL_FLOOR * np.abs(res[_MEAN]))] = np.nan
    res[:_NONFINITE, none] = np.nan  # no finite value: every statistic of values is NaN
    res[_NONFINITE] = n_bad
    res[_NONFINITE][none & (n_bad == 0)] = np.nan

    out = np.empty((n, plan.n_features), dtype=np.float64)
    out[:, plan.stat_columns] = res.reshape(-1, n).T
    out[:, plan.frac_columns] = (n_over / cnt[plan.thr_idx]).T
    if plan.dsi_columns is not None:
        count, all_steps = _dsi(marks, cnt, ends, starts, plan)
        out[:, plan.dsi_columns[0]] = count
        out[:, plan.dsi_columns[1]] = all_steps
    return out


def _marks(grid: np.ndarray, plan: _Plan) -> np.ndarray:
    """``(2 n_signals + k, span)`` bool: finite; measured non-finite (inf, or NaN with
    its companion flag > 0); finite and over the seed threshold (k thresholded signals,
    as ``Signal.over_threshold``)."""
    n_sig, span = grid.shape
    marks = np.empty((2 * n_sig + len(plan.thr_idx), span), dtype=bool)
    np.isfinite(grid, out=marks[:n_sig])
    bad = marks[n_sig : 2 * n_sig]
    np.isinf(grid, out=bad)
    for s, f in plan.companions:
        bad[s] |= np.isnan(grid[s]) & (grid[f] > 0)
    if len(plan.thr_idx):
        xt = grid[plan.thr_idx]
        over = marks[2 * n_sig :]
        np.less(xt, plan.low, out=over)
        over |= xt > plan.high
        over &= marks[plan.thr_idx]
    return marks


def _window_sums(marks, starts, ends, window: int, tiled: bool) -> np.ndarray:
    """``(rows, n)`` int: how many marks each window holds, per row of ``marks``."""
    rows, span = marks.shape
    if tiled:
        return marks.reshape(rows, len(ends), window).sum(axis=-1)
    csum = np.zeros((rows, span + 1), dtype=np.int64)
    np.cumsum(marks, axis=1, out=csum[:, 1:])
    return csum[:, ends + 1] - csum[:, starts]


def _last_finite(finite, ends, window: int, tiled: bool) -> np.ndarray:
    """``(n_signals, n)`` grid column of each window's last finite value (any column
    inside the window where it has none)."""
    n_sig, span = finite.shape
    if tiled:
        back = np.argmax(finite.reshape(n_sig, len(ends), window)[..., ::-1], axis=-1)
        return ends - back
    last_pos = np.maximum.accumulate(np.where(finite, np.arange(span), -1), axis=1)
    return np.maximum(last_pos[:, ends], ends - (window - 1))


def _float_sums(grid, finite, cnt, shift, starts, extremes, plan: _Plan) -> np.ndarray:
    """``(9, n_signals, n)`` sums over each window's finite values of y, t, ws, wl, t^2,
    y^2, t y, ws y, wl y (y = value - shift, t = position in the window, w* = EWMA
    weights), by the dense or sparse path; writes (min, max) into ``extremes``.

    A (window, signal) with no finite value gets anything; the caller masks it.
    """
    n_sig, n = cnt.shape
    if n <= _FEW:
        # A few windows (streaming): both paths over every signal, then pick per window;
        # cheaper than sorting signals out, and each row's sums are the same either way.
        sums, ext = _dense_sums(grid, cnt, shift, starts, plan)
        if cnt.any():
            take = cnt > SPARSE_MAX
            got_sums, got_ext = _sparse_sums(grid, finite, cnt, shift, starts, plan)
            sums = np.where(take, sums, got_sums)
            ext = np.where(take, ext, got_ext)
        extremes[...] = ext
        return sums
    sums = np.zeros((9, n_sig, n), dtype=np.float64)
    sparse = np.flatnonzero(((cnt > 0) & (cnt <= SPARSE_MAX)).any(axis=1))
    dense = np.flatnonzero(cnt.max(axis=1) > SPARSE_MAX)
    if sparse.size:
        got = _sparse_sums(grid[sparse], finite[sparse], cnt[sparse], shift[sparse], starts, plan)
        sums[:, sparse], extremes[:, sparse] = got
    if dense.size:
        got_sums, got_ext = _dense_sums(grid[dense], cnt[dense], shift[dense], starts, plan)
        take = cnt[dense] > SPARSE_MAX
        if take.all():
            sums[:, dense], extremes[:, dense] = got_sums, got_ext
        else:  # windows of these signals with 1..SPARSE_MAX values keep the sparse sums
            sums[:, dense] = np.where(take, got_sums, sums[:, dense])
            extremes[:, dense] = np.where(take, got_ext, extremes[:, dense])
    return sums


def _dense_sums(grid, cnt, shift, starts, plan: _Plan):
    """Sums over each window's ``window`` values, gaps counted as y = 0."""
    window = plan.window
    n_rows, n = cnt.shape
    if n == 1:
        x = grid[:, starts[0] : starts[0] + window][:, None]
    else:
        view = np.lib.stride_tricks.sliding_window_view(grid, window, axis=1)
        step = starts[1] - starts[0]
        if step > 0 and (np.diff(starts) == step).all():  # evenly spaced: a view, no copy
            x = view[:, starts[0] : starts[-1] + 1 : step]
        else:
            x = view[:, starts]
    # C order explicitly: a ufunc keeps the layout of a strided input by default
    y = np.empty((n_rows, n, window), dtype=np.float64)
    np.subtract(x, shift[..., None], out=y)
    ext = np.empty((2, n_rows, n), dtype=np.float64)
    np.min(x, axis=-1, out=ext[0])
    np.max(x, axis=-1, out=ext[1])
    sums = np.empty((9, n_rows, n), dtype=np.float64)
    sums[1:5] = plan.full[..., None]
    # Windows with gaps (or infinities): zero the gaps, redo what the mask changes.
    r, c = np.nonzero((cnt > SPARSE_MAX) & (cnt < window))
    if r.size:
        xp = x[r, c]
        fp = np.isfinite(xp)
        y[r, c] = np.where(fp, y[r, c], 0.0)
        ext[0, r, c] = np.min(xp, axis=-1, where=fp, initial=np.inf)
        ext[1, r, c] = np.max(xp, axis=-1, where=fp, initial=-np.inf)
        sums[1:5, r, c] = np.einsum("mw,kw->km", fp.astype(np.float64), plan.weights)
    y2 = y.reshape(-1, window)
    np.add.reduce(y, axis=-1, out=sums[0])
    np.einsum("mw,mw->m", y2, y2, out=sums[5].reshape(-1))
    np.einsum("mw,kw->km", y2, plan.weights[:3], out=sums[6:].reshape(3, -1))
    return sums, ext


def _sparse_sums(grid, finite, cnt, shift, starts, plan: _Plan):
    """Sums over each window's first ``SPARSE_MAX`` finite values (all of them where
    the count is at most ``SPARSE_MAX``: the only windows the caller keeps).

    The gathered values lie along a leading axis of length ``SPARSE_MAX`` and are
    summed by a fixed pairwise tree of elementwise additions, the same for every
    (window, signal) whatever the block holds.
    """
    n_rows, span = grid.shape
    flat = np.flatnonzero(finite)  # finite positions in the flattened grid, row by row
    origin = np.arange(0, n_rows * span, span)[:, None] + starts  # (rows, n): window starts
    k = np.arange(SPARSE_MAX)[:, None, None]
    valid = k < cnt  # (K, rows, n)
    at = flat[np.minimum(np.searchsorted(flat, origin) + k, flat.size - 1)]
    # position in the window; the padding column of the weights (all 0) where not valid
    t = np.where(valid, at - origin, plan.window)
    v = np.ravel(grid)[at]
    # a = [y, t, ws, wl, t^2, y, t, ws, wl], 0 where not valid; then rows 5.. times y
    a = np.zeros((9, SPARSE_MAX, n_rows, len(starts)), dtype=np.float64)
    np.subtract(v, shift, out=a[0:6:5], where=valid)
    a[1:5] = plan.padded[:, t]
    a[6:9] = a[1:4]
    np.multiply(a[5:9], a[0], out=a[5:9])
    half = a[:, :4] + a[:, 4:]
    quarter = half[:, :2] + half[:, 2:]
    ext = np.stack(
        [np.where(valid, v, np.inf).min(axis=0), np.where(valid, v, -np.inf).max(axis=0)]
    )
    return quarter[:, 0] + quarter[:, 1], ext


def _dsi(marks, cnt, ends, starts, plan: _Plan):
    """DSI cross features of grad_cv, attn_kl, update_cos, from their marks.

    Between measurements a signal keeps the state of its last measurement inside the
    window (attn_kl is measured every 50 steps); before its first one it is unknown,
    which counts as "not over".
    """
    n_sig, span = cnt.shape[0], marks.shape[1]
    finite = marks[plan.dsi_idx]
    over = marks[2 * n_sig + plan.dsi_thr]
    j = np.arange(span)
    last = np.maximum.accumulate(np.where(finite, j, -1), axis=1)
    # over or not at each column, carried forward from the last measurement
    state = over[plan.rows[:3], last] & (last >= 0)
    measured = cnt[plan.dsi_idx] > 0  # (3, n): measured inside the window
    now = state[:, ends] & measured
    count = np.where(measured.any(axis=0), now.sum(axis=0), np.nan)
    # The trailing run of "all three over" stops at the last column where they were not
    # all over, or before the first column where all three have been measured inside
    # the window, or at the window's start.
    not_all = np.maximum.accumulate(np.where(state.all(axis=0), -1, j))
    first = np.minimum.accumulate(np.where(finite, j, span)[:, ::-1], axis=1)[:, ::-1]
    stop = np.maximum(np.maximum(not_all[ends], first[:, starts].max(axis=0) - 1), starts - 1)
    all_steps = np.where(measured.all(axis=0), ends - stop, np.nan)
    return count, all_steps
