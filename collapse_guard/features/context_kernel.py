"""The run-context accumulator, compiled: rows in, state updated, fields out.

One function, :func:`advance`, feeds rows to the state and emits the fields at given
steps; :func:`emit` gives the fields of the state as it stands. The live accumulator
(``RunContext.update``) calls ``advance`` with one row at a time, the offline path with
a whole run and its window ends: the same machine code runs the same operations on
the same state in the same order, so both give the same bits (numba, no fastmath:
floating-point operations are neither reordered nor fused; the state between calls is
float64 in memory, exactly what the compiled code holds).

State (all float64 so that it is one kind of array, saved as plain lists):

- ``run`` (:data:`RUN_SLOTS`): first and last step, the LR's history, the best loss,
  the current rise's top LR and its two anchors (step, log LR, log smoothed loss and
  grad norm: the reference and the next one, ``context_fields``, "The rise response");
- ``tracks`` ``(len(TRACKED), len(TRACK_SLOTS))``: per tracked signal its short and
  long EWMA sums and weights, the step of its last value, its early values' count, its
  early reference and whether that is settled;
- ``early`` ``(len(TRACKED), EARLY_STEPS)``: the values of the early steps.

Fields are those of :data:`~collapse_guard.features.context_fields.CONTEXT_FIELDS`, in
that order. Ratios are NaN unless the denominator is finite and > 0 (NaN = missing for
LightGBM; never an infinity).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from collapse_guard.features.context_fields import (
    CONTEXT_FIELDS,
    EARLY_STEPS,
    LONG_SPAN,
    LOSS_SMOOTH_STEPS,
    LR_SETTLE_ROWS,
    MIN_LOG_LR_CLIMB,
    RESPONSE_STEPS,
    SHORT_SPAN,
    TRACKED,
)
from collapse_guard.features.rises import LR_RISE_TOL, RISE_STEPS

__all__ = [
    "N_FIELDS",
    "RUN_SLOTS",
    "TRACK_SLOTS",
    "advance",
    "decays",
    "emit",
    "fresh_state",
]

N_FIELDS = len(CONTEXT_FIELDS)
RUN_SLOTS: tuple[str, ...] = (
    "first_step",
    "last_step",
    "lr",  # last finite LR
    "lr_first",  # first positive LR
    "lr_first_step",  # step of the first finite LR
    "lr_peak",
    "lr_rise_step",  # step of the latest rise
    "lr_held",  # rows in a row without a rise
    "lr_settled",  # 1 once the LR has held or fallen for LR_SETTLE_ROWS rows
    "lr_in_rise",  # 1 while the LR rises row after row
    "lr_prior_peak",  # highest LR before the latest re-warm
    "loss_best",  # best smoothed loss
    "loss_best_step",
    "rise_top",  # highest LR since the current rise began
    # the rise response's anchors: the reference, and the next one it moves up to
    "ref_step",
    "ref_log_lr",
    "ref_log_loss",
    "ref_log_grad",
    "next_step",
    "next_log_lr",
    "next_log_loss",
    "next_log_grad",
)
TRACK_SLOTS: tuple[str, ...] = (
    "short_sum",
    "short_weight",
    "long_sum",
    "long_weight",
    "last_step",
    "early_count",
    "early_ref",
    "early_settled",
)
_R = {name: i for i, name in enumerate(RUN_SLOTS)}
_T = {name: i for i, name in enumerate(TRACK_SLOTS)}
# numba reads module-level integers as compile-time constants
_FIRST, _LAST, _LR, _LR_FIRST, _LR_FIRST_STEP, _LR_PEAK = (
    _R[k] for k in ("first_step", "last_step", "lr", "lr_first", "lr_first_step", "lr_peak")
)
_LR_RISE_STEP, _LR_HELD, _LR_SETTLED, _LR_IN_RISE, _LR_PRIOR = (
    _R[k] for k in ("lr_rise_step", "lr_held", "lr_settled", "lr_in_rise", "lr_prior_peak")
)
_BEST, _BEST_STEP = _R["loss_best"], _R["loss_best_step"]
_TOP, _REF_AT, _NEXT_AT = _R["rise_top"], _R["ref_step"], _R["next_step"]
# an anchor is 4 slots from its step: step, log LR, log loss, log grad norm
_A_LR, _A_LOSS, _A_GRAD = 1, 2, 3
_SS, _SW, _LS, _LW, _TLAST, _NEARLY, _REF, _SETTLED = range(len(TRACK_SLOTS))
_LOSS, _GRAD = TRACKED.index("loss"), TRACKED.index("grad_norm")
_EARLY_RATIOS = np.array(
    [TRACKED.index(s) for s in ("param_norm", "attn_logit_max", "output_logit_max")]
)
_EARLY = float(EARLY_STEPS)

# A rise is an LR above the previous one by more than this share: schedulers that
# recompute the LR each step jitter in the last bits without rising (features/rises.py,
# the evaluation's "inside an LR rise", uses the same share).
_LR_RISE_TOL = LR_RISE_TOL
_LR_SETTLE_ROWS = LR_SETTLE_ROWS
_RESPONSE_STEPS = RESPONSE_STEPS
_MIN_CLIMB = MIN_LOG_LR_CLIMB
_RISE_STEPS = float(RISE_STEPS)

_JIT = {"cache": True, "error_model": "numpy"}

# emit() writes the fields by position: this is the order it writes them in
_EMITTED = (
    "ctx__steps",
    "ctx__lr_over_peak",
    "ctx__lr_over_start",
    "ctx__lr_steps_since_rise",
    "ctx__lr_over_prior_peak",
    "ctx__loss_over_best",
    "ctx__loss_steps_since_best",
    "ctx__loss_over_early",
    "ctx__grad_norm_over_long",
    "ctx__param_norm_over_early",
    "ctx__attn_logit_max_over_early",
    "ctx__output_logit_max_over_early",
    "ctx__loss_per_log_lr_rise",
    "ctx__grad_norm_per_log_lr_rise",
)
if tuple(name for name, _ in CONTEXT_FIELDS) != _EMITTED:
    raise ImportError("context_fields.CONTEXT_FIELDS and context_kernel.emit disagree on order")


def _fresh() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    run = np.full(len(RUN_SLOTS), np.nan)
    run[[_LR_HELD, _LR_SETTLED, _LR_IN_RISE]] = 0.0
    tracks = np.zeros((len(TRACKED), len(TRACK_SLOTS)))
    tracks[:, [_TLAST, _REF]] = np.nan
    early = np.full((len(TRACKED), EARLY_STEPS), np.nan)
    return run, tracks, early


_FRESH = _fresh()


def fresh_state() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(run, tracks, early)`` of a run with no rows yet (new arrays)."""
    return tuple(a.copy() for a in _FRESH)


def decays() -> np.ndarray:
    """``(len(TRACKED), 2)``: the per-step decay of the short and long EWMA of each
    tracked signal (pandas' span convention, alpha = 2 / (span + 1); the loss's short
    one from its time constant)."""
    out = np.empty((len(TRACKED), 2))
    out[:, 0] = 1.0 - 2.0 / (SHORT_SPAN + 1.0)
    out[_LOSS, 0] = math.exp(-1.0 / LOSS_SMOOTH_STEPS)
    out[:, 1] = 1.0 - 2.0 / (LONG_SPAN + 1.0)
    return out


@numba.njit(**_JIT)
def advance(run, tracks, early, decay, steps, values, ends, out):
    """Feed rows ``(steps[i], values[:, i])`` in order; before the first row whose step
    is past ``ends[j]`` (sorted), write the fields at step ``ends[j]`` into ``out[j]``.

    ``values`` rows: the LR, then the :data:`TRACKED` signals (NaN = not measured).
    The per-signal work is written out here rather than in helpers: a call into
    another compiled function costs more than its arithmetic (each array argument is
    reference-counted, each call checks an error status): measured 10x on 200 rows.
    """
    j = 0
    for i in range(len(steps)):
        while j < len(ends) and ends[j] < steps[i]:
            emit(run, tracks, early, float(ends[j]), out[j])
            j += 1
        t = float(steps[i])
        if math.isnan(run[_FIRST]):
            run[_FIRST] = t
        prev_t = run[_LAST]
        run[_LAST] = t
        lr_row = math.isfinite(values[0, i])
        if lr_row:
            held, prev_lr = run[_LR_HELD], run[_LR]
            _lr(run, t, values[0, i])
            if run[_LR_RISE_STEP] == t and (
                math.isnan(run[_REF_AT]) or held >= _LR_SETTLE_ROWS
            ):  # a new rise: its reference is the row before the climb (tracks not fed yet)
                _anchor(run, _NEXT_AT, prev_t, prev_lr, tracks)
                _copy_anchor(run, _NEXT_AT, _REF_AT)
                run[_TOP] = prev_lr
        early_row = t < run[_FIRST] + _EARLY
        for c in range(tracks.shape[0]):
            if not early_row and tracks[c, _SETTLED] == 0.0:  # once per signal: the
                tracks[c, _REF] = _median(early[c], tracks[c, _NEARLY])  # early steps
                tracks[c, _SETTLED] = 1.0  # are over
            v = values[c + 1, i]
            if not math.isfinite(v):  # an infinity would stay in the averages for good
                continue
            n = tracks[c, _NEARLY]
            if early_row and n < _EARLY:  # (steps are unique integers: n < EARLY_STEPS anyway)
                early[c, int(n)] = v
                tracks[c, _NEARLY] = n + 1.0
            if math.isnan(tracks[c, _TLAST]):
                tracks[c, _SS], tracks[c, _SW], tracks[c, _LS], tracks[c, _LW] = v, 1.0, v, 1.0
            else:
                # weights decay with the steps since the last value, not the rows
                gap = t - tracks[c, _TLAST]
                # pow(q, 1) is q exactly: one step (the usual log) skips the call
                short = decay[c, 0] if gap == 1.0 else math.pow(decay[c, 0], gap)
                long = decay[c, 1] if gap == 1.0 else math.pow(decay[c, 1], gap)
                tracks[c, _SS] = tracks[c, _SS] * short + v
                tracks[c, _SW] = tracks[c, _SW] * short + 1.0
                tracks[c, _LS] = tracks[c, _LS] * long + v
                tracks[c, _LW] = tracks[c, _LW] * long + 1.0
            tracks[c, _TLAST] = t
        if math.isfinite(values[_LOSS + 1, i]):
            smooth = tracks[_LOSS, _SS] / tracks[_LOSS, _SW]
            if not smooth >= run[_BEST]:  # NaN best: the first one
                run[_BEST] = smooth
                run[_BEST_STEP] = t
        if lr_row and math.isfinite(run[_REF_AT]) and run[_LR_HELD] < _LR_SETTLE_ROWS:
            _climb(run, t, values[0, i], tracks)
    while j < len(ends):
        emit(run, tracks, early, float(ends[j]), out[j])
        j += 1


@numba.njit(**_JIT, inline="always")
def _lr(run, t, v):
    """Take a finite LR ``v`` at step ``t`` into the LR's history."""
    if math.isnan(run[_LR_FIRST_STEP]):
        run[_LR_FIRST_STEP] = t
    if v > 0.0 and math.isnan(run[_LR_FIRST]):
        run[_LR_FIRST] = v
    prev = run[_LR]
    if math.isfinite(prev):
        if v > prev + _LR_RISE_TOL * abs(prev):
            if run[_LR_IN_RISE] == 0.0:
                run[_LR_IN_RISE] = 1.0
                # a re-warm is measured against the peak before it; a warm-up has none
                run[_LR_PRIOR] = run[_LR_PEAK] if run[_LR_SETTLED] == 1.0 else math.nan
            run[_LR_RISE_STEP] = t
            run[_LR_HELD] = 0.0
        else:
            run[_LR_IN_RISE] = 0.0
            run[_LR_HELD] += 1.0
            if run[_LR_HELD] >= _LR_SETTLE_ROWS:
                run[_LR_SETTLED] = 1.0
    if not v <= run[_LR_PEAK]:  # NaN peak: the first value
        run[_LR_PEAK] = v
    run[_LR] = v


@numba.njit(**_JIT, inline="always")
def _log_pos(x):
    return math.log(x) if x > 0.0 and math.isfinite(x) else math.nan


@numba.njit(**_JIT, inline="always")
def _anchor(run, at, t, lr, tracks):
    """Write an anchor at slot ``at``: step ``t``, the LR ``lr`` and the smoothed loss and
    grad norm as the tracks stand, as logs (NaN where not positive)."""
    run[at] = t
    run[at + _A_LR] = _log_pos(lr)
    run[at + _A_LOSS] = _log_pos(_short(tracks, _LOSS))
    run[at + _A_GRAD] = _log_pos(_short(tracks, _GRAD))


@numba.njit(**_JIT, inline="always")
def _copy_anchor(run, src, dst):
    for k in range(4):
        run[dst + k] = run[src + k]


@numba.njit(**_JIT, inline="always")
def _usable(run, at):
    return math.isfinite(run[at + _A_LR]) and math.isfinite(run[at + _A_LOSS])


@numba.njit(**_JIT, inline="always")
def _climb(run, t, lr, tracks):
    """A row of an open rise (tracks fed): the top LR, and the anchors moved up so that
    the reference stays RESPONSE_STEPS to twice that back (an unusable one, a warm-up from
    LR 0 or before the first loss, is replaced by this row at once)."""
    if not lr <= run[_TOP]:  # NaN top: a rise from no LR
        run[_TOP] = lr
    if not _usable(run, _NEXT_AT) or t - run[_NEXT_AT] >= _RESPONSE_STEPS:
        if _usable(run, _NEXT_AT):
            _copy_anchor(run, _NEXT_AT, _REF_AT)
        _anchor(run, _NEXT_AT, t, lr, tracks)
    if not _usable(run, _REF_AT):
        _copy_anchor(run, _NEXT_AT, _REF_AT)


@numba.njit(**_JIT)
def _median(values, count):
    n = int(count)
    return np.median(values[:n]) if n > 0 else math.nan


@numba.njit(**_JIT)
def _ratio(a, b):
    # total: NaN for a zero, negative or non-finite reference, and for a quotient that
    # overflows (a reference of 1e-310): a field is never infinite
    r = a / b if math.isfinite(a) and math.isfinite(b) and b > 0.0 else math.nan
    return r if math.isfinite(r) else math.nan


@numba.njit(**_JIT)
def _early_ref(run, tracks, early, c, now):
    if tracks[c, _SETTLED] == 1.0:
        return tracks[c, _REF]
    if now >= run[_FIRST] + _EARLY:  # a step past the early ones, before its row came
        return _median(early[c], tracks[c, _NEARLY])
    return math.nan


@numba.njit(**_JIT)
def _short(tracks, c):
    return tracks[c, _SS] / tracks[c, _SW] if tracks[c, _SW] > 0.0 else math.nan


@numba.njit(**_JIT)
def emit(run, tracks, early, now, out):
    """Write the fields at step ``now`` (>= the last row's step) into ``out``; reads the
    state only."""
    lr = run[_LR]
    out[0] = now - run[_FIRST]
    out[1] = _ratio(lr, run[_LR_PEAK])
    out[2] = _ratio(lr, run[_LR_FIRST])
    since = run[_LR_RISE_STEP] if math.isfinite(run[_LR_RISE_STEP]) else run[_LR_FIRST_STEP]
    out[3] = now - since
    out[4] = _ratio(lr, run[_LR_PRIOR])
    loss = _short(tracks, _LOSS)
    out[5] = _ratio(loss, run[_BEST])
    out[6] = now - run[_BEST_STEP]
    out[7] = _ratio(loss, _early_ref(run, tracks, early, _LOSS, now))
    long = tracks[_GRAD, _LS] / tracks[_GRAD, _LW] if tracks[_GRAD, _LW] > 0.0 else math.nan
    out[8] = _ratio(_short(tracks, _GRAD), long)
    for k in range(len(_EARLY_RATIOS)):
        c = _EARLY_RATIOS[k]
        out[9 + k] = _ratio(_short(tracks, c), _early_ref(run, tracks, early, c, now))
    # the rise response: inside a rise (RISE_STEPS since the LR last rose), once the LR
    # has climbed MIN_LOG_LR_CLIMB above the reference
    climb = _log_pos(run[_TOP]) - run[_REF_AT + _A_LR]
    if now - run[_LR_RISE_STEP] < _RISE_STEPS and climb >= _MIN_CLIMB:
        out[12] = (_log_pos(loss) - run[_REF_AT + _A_LOSS]) / climb
        out[13] = (_log_pos(_short(tracks, _GRAD)) - run[_REF_AT + _A_GRAD]) / climb
    else:
        out[12] = math.nan
        out[13] = math.nan
