"""The one feature kernel: a stack of windows -> a stack of feature vectors.

Every caller (one streaming window in the guard or the service, thousands of windows
of a run for training) goes through :func:`window_features`, so online and offline
features cannot drift apart. The kernel is vectorised over windows and signals; the
statistics are those of the table in :mod:`collapse_guard.features.schema`.

Input convention, as in run files: NaN = not measured at that step; ``inf``/``-inf`` =
measured non-finite. A NaN ``loss`` whose ``loss_nonfinite`` flag is 1 (or a NaN
``grad_norm`` whose ``grad_nonfinite`` count is > 0) was measured too and counts in
``__nonfinite`` (only when the flag column is among the signals).

Bit-equality between streaming and batch rests on three facts, all tested: the input
view is only touched by exact operations (masks, counts, arg-reductions, elementwise
arithmetic); every floating-point sum runs along the last axis of an array the kernel
allocates, so each window's sums see the same values in the same memory layout
whatever ``n`` is and whatever view the caller passed; and no BLAS call is used
(matrix products may block differently for different ``n``). The speed comes from
doing each statistic as one pass over the stack (numpy loops, ``einsum`` for
weighted sums) and from skipping mask-only work on fully measured signals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from collapse_guard.features.schema import SIGNAL_STATS, feature_names, has_dsi
from collapse_guard.signals import DSI_SIGNALS, signal

__all__ = ["COMPANION_FLAGS", "EWMA_LONG_SPAN", "EWMA_SHORT_SPAN", "window_features"]

# Spans in steps, pandas convention alpha = 2 / (span + 1): the short one follows the
# last ~10 steps, the long one the bulk of a 200-step window.
EWMA_SHORT_SPAN = 10
EWMA_LONG_SPAN = 100

# A NaN in these signals was measured (non-finite) when the flag column is > 0.
COMPANION_FLAGS: dict[str, str] = {"loss": "loss_nonfinite", "grad_norm": "grad_nonfinite"}

# A standard deviation this small relative to the mean is rounding noise of a constant
# window (e.g. a constant LR), not spread: the z-score is then undefined (NaN).
_STD_REL_FLOOR = 1e-12


@dataclass(frozen=True)
class _Plan:
    """Everything about the feature layout that depends only on (signals, window)."""

    window: int
    n_features: int
    t: np.ndarray  # positions 0..W-1 (float): the regression abscissa
    w_short: np.ndarray  # EWMA weights by distance from the last position
    w_long: np.ndarray
    weights: tuple[np.ndarray, ...]  # (t, t^2, w_short, w_long): summed over the mask
    full_sums: np.ndarray  # (4,): their sums over a fully measured window
    companions: tuple[tuple[int, int], ...]  # (signal index, flag index)
    thr_idx: np.ndarray  # indices of signals with a seed threshold
    low: np.ndarray  # (k, 1); -inf where no lower threshold
    high: np.ndarray  # (k, 1); +inf where no upper threshold
    dsi_thr: np.ndarray | None  # positions of the DSI signals inside thr_idx
    columns: dict[str, np.ndarray]  # stat -> output column of each signal (or thr signal)


def _ewma_weights(window: int, span: int) -> np.ndarray:
    alpha = 2.0 / (span + 1.0)
    return (1.0 - alpha) ** np.arange(window - 1, -1, -1, dtype=np.float64)


@lru_cache(maxsize=32)
def _plan(signals: tuple[str, ...], window: int) -> _Plan:
    names = feature_names(signals)
    where = {name: i for i, name in enumerate(names)}
    thr = [i for i, s in enumerate(signals) if signal(s).has_threshold]
    columns = {
        stat: np.array([where[f"{signals[i]}__{stat}"] for i in thr], dtype=np.intp)
        if stat == "frac_over"
        else np.array([where[f"{s}__{stat}"] for s in signals], dtype=np.intp)
        for stat in SIGNAL_STATS
    }
    dsi_thr = None
    if has_dsi(signals):
        dsi_thr = np.array([thr.index(signals.index(s)) for s in DSI_SIGNALS], dtype=np.intp)
        columns["dsi__count"] = np.array([where["dsi__count"]], dtype=np.intp)
        columns["dsi__all_steps"] = np.array([where["dsi__all_steps"]], dtype=np.intp)
    lows = [signal(signals[i]).low for i in thr]
    highs = [signal(signals[i]).high for i in thr]
    t = np.arange(window, dtype=np.float64)
    weights = (
        t,
        t * t,
        _ewma_weights(window, EWMA_SHORT_SPAN),
        _ewma_weights(window, EWMA_LONG_SPAN),
    )
    # Summed by the same einsum as partial windows, so a full window is not a special case.
    full = np.ones((1, window), dtype=np.float64)
    return _Plan(
        window=window,
        n_features=len(names),
        t=t,
        w_short=weights[2],
        w_long=weights[3],
        weights=weights,
        full_sums=np.array([np.einsum("mw,w->m", full, v)[0] for v in weights]),
        companions=tuple(
            (signals.index(s), signals.index(f))
            for s, f in COMPANION_FLAGS.items()
            if s in signals and f in signals
        ),
        thr_idx=np.array(thr, dtype=np.intp),
        low=np.array([-np.inf if v is None else v for v in lows], dtype=np.float64)[:, None],
        high=np.array([np.inf if v is None else v for v in highs], dtype=np.float64)[:, None],
        dsi_thr=dsi_thr,
        columns=columns,
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
    plan = _plan(signals, windows.shape[1])
    # All-NaN windows are normal (signals not measured): keep numpy quiet about them.
    with np.errstate(all="ignore"):
        return _kernel(windows.transpose(0, 2, 1), plan)


def _kernel(x: np.ndarray, plan: _Plan) -> np.ndarray:
    """``x``: (n, S, W) view of any strides. Only exact operations (masks, counts,
    arg-reductions, elementwise arithmetic) touch ``x``; every floating-point sum runs
    on arrays this function allocates, hence C-contiguous in one layout for all callers.
    """
    finite = np.isfinite(x)
    cnt = np.count_nonzero(finite, axis=-1)
    none = cnt == 0
    last = _last_finite(x, finite, none)
    # Shift by the last value: sums of squares stay accurate for values far from 0
    # (parameter norms, bytes of memory), and a constant window gives std exactly 0.
    shift = np.where(none, 0.0, last)
    y = np.where(finite, x - shift[..., None], 0.0)
    m1 = y.sum(axis=-1) / cnt
    mean = shift + m1
    std = np.sqrt(np.maximum(np.einsum("nsw,nsw->ns", y, y) / cnt - m1 * m1, 0.0))
    masks = _mask_sums(finite, cnt, plan)

    out = np.empty((x.shape[0], plan.n_features), dtype=np.float64)
    cols = plan.columns
    out[:, cols["last"]] = last
    out[:, cols["mean"]] = mean
    out[:, cols["std"]] = std
    out[:, cols["min"]] = _extreme(x, y, shift, none, np.argmin)
    out[:, cols["max"]] = _extreme(x, y, shift, none, np.argmax)
    out[:, cols["slope"]] = _slope(y, m1, cnt, masks, plan)
    out[:, cols["ewma_ratio"]] = _ewma_ratio(y, shift, masks, plan)
    degenerate = ~(std > _STD_REL_FLOOR * np.abs(mean))
    out[:, cols["zscore"]] = np.where(degenerate, np.nan, -m1 / std)
    n_bad = _nonfinite(x, cnt, plan)
    out[:, cols["nonfinite"]] = np.where(none & (n_bad == 0), np.nan, n_bad)

    over = _over_threshold(x, finite, plan)
    out[:, cols["frac_over"]] = np.count_nonzero(over, axis=-1) / cnt[:, plan.thr_idx]
    if plan.dsi_thr is not None:
        dsi_over = over[:, plan.dsi_thr]
        dsi_finite = finite[:, plan.thr_idx[plan.dsi_thr]]
        count, all_steps = _dsi(dsi_over, dsi_finite)
        out[:, cols["dsi__count"][0]] = count
        out[:, cols["dsi__all_steps"][0]] = all_steps
    return out


def _last_finite(x: np.ndarray, finite: np.ndarray, none: np.ndarray) -> np.ndarray:
    # argmax of the reversed mask = distance of the last finite value from the end
    back = np.argmax(finite[..., ::-1], axis=-1)
    pos = x.shape[-1] - 1 - back
    last = np.take_along_axis(x, pos[..., None], axis=-1)[..., 0]
    return np.where(none, np.nan, last)


def _mask_sums(finite: np.ndarray, cnt: np.ndarray, plan: _Plan) -> np.ndarray:
    """(n, S, 4): sums of t, t^2, short and long EWMA weights over the finite steps.

    They depend on the mask only: a fully measured signal (most of them) takes the
    precomputed full-window sums, so only gappy ones (attention every 50 steps, logs
    with holes) pay for the reduction.
    """
    sums = np.broadcast_to(plan.full_sums, (*cnt.shape, 4)).copy()
    partial = cnt < plan.window
    if partial.any():
        sub = finite[partial].astype(np.float64)
        sums[partial] = np.stack([np.einsum("mw,w->m", sub, v) for v in plan.weights], axis=-1)
    return sums


def _extreme(x, y, shift, none, arg) -> np.ndarray:
    # Gaps hold 0 in y, i.e. the last value, which is in the data: the extreme of y is
    # an extreme of the finite values. Read it back from x so min/max are exact inputs.
    pos = arg(y, axis=-1)[..., None]
    at_gap = np.take_along_axis(y, pos, axis=-1)[..., 0] == 0.0
    value = np.where(at_gap, shift, np.take_along_axis(x, pos, axis=-1)[..., 0])
    return np.where(none, np.nan, value)


def _slope(y, m1, cnt, masks, plan: _Plan) -> np.ndarray:
    # Least squares over the finite points: sum (t - tm)(y - ym) / sum (t - tm)^2.
    st, stt = masks[..., 0], masks[..., 1]
    t_mean = st / cnt
    sxy = np.einsum("nsw,w->ns", y, plan.t) - t_mean * m1 * cnt
    sxx = stt - st * t_mean
    return np.where(cnt < 2, np.nan, sxy / sxx)


def _ewma_ratio(y, shift, masks, plan: _Plan) -> np.ndarray:
    # Each EWMA is a weighted mean of the finite values, weights decaying with the
    # distance from "now", renormalised over the values present (gaps do not bias it).
    short = shift + np.einsum("nsw,w->ns", y, plan.w_short) / masks[..., 2]
    long = shift + np.einsum("nsw,w->ns", y, plan.w_long) / masks[..., 3]
    return np.where(long == 0.0, np.nan, short / long)


def _nonfinite(x: np.ndarray, cnt: np.ndarray, plan: _Plan) -> np.ndarray:
    """Measured non-finite values: inf anywhere, NaN where a companion flag says so."""
    n_bad = np.zeros(cnt.shape, dtype=np.float64)
    partial = cnt < plan.window  # a fully finite window has none: skip it
    if partial.any():
        n_bad[partial] = np.count_nonzero(np.isinf(x[partial]), axis=-1)
    for s, f in plan.companions:
        flagged = np.isnan(x[:, s]) & (x[:, f] > 0)
        n_bad[:, s] += np.count_nonzero(flagged, axis=-1)
    return n_bad


def _over_threshold(x: np.ndarray, finite: np.ndarray, plan: _Plan) -> np.ndarray:
    """(n, k, W) bool: finite and outside the seed band (as ``Signal.over_threshold``)."""
    xt = x[:, plan.thr_idx]
    return ((xt < plan.low) | (xt > plan.high)) & finite[:, plan.thr_idx]


def _dsi(over: np.ndarray, finite: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """DSI cross features from (n, 3, W) over-threshold and measured masks.

    Between measurements a signal keeps the state of its last measurement inside the
    window (attn_kl is measured every 50 steps); before its first one it is unknown,
    which counts as "not over".
    """
    window = over.shape[-1]
    pos = np.where(finite, np.arange(window), -1)
    last_pos = np.maximum.accumulate(pos, axis=-1)
    seen = last_pos >= 0
    state = np.take_along_axis(over, np.maximum(last_pos, 0), axis=-1) & seen
    measured = seen[..., -1]  # (n, 3): measured at least once in the window
    count = np.where(measured.any(axis=-1), state[..., -1].sum(axis=-1), np.nan)
    broken = ~state.all(axis=1)[:, ::-1]  # (n, W), from now backwards
    run = np.where(broken.any(axis=-1), np.argmax(broken, axis=-1), window)
    all_steps = np.where(measured.all(axis=-1), run, np.nan)
    return count, all_steps
