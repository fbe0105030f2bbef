"""When a run is "in an LR rise": the one definition features and evaluation share.

Healthy runs reach their highest risk while the LR rises (issue 34: warmup's end, a safe
re-warm), so the evaluation reports false alarms and ROC-AUC inside rises apart from the
rest. The definition, on a run's logged ``lr`` column:

- the LR *rises at* a logged step when it stands more than ``tol`` (relative) above its
  lowest value since the last rise (or since the run's first logged LR). Against the
  running minimum, not the previous row: a ramp too slow to clear the tolerance row by
  row still counts once its climb adds up, while jitter in the last bits of a scheduler
  that recomputes the LR (a cosine tail, a constant) never does;
- a step is *in a rise* when the LR rose at it or within the ``within`` steps before it
  (a rise at step s covers the steps t with 0 <= t - s < within). ``within`` is the
  horizon, 200 steps (``runfiles.label.HORIZON``; features import no runfiles, so the
  number is repeated here and a test pins the two equal): a warning that fires in a rise
  must hold for as long as a forecast looks ahead.

Unmeasured rows (NaN LR) neither rise nor break a rise; a run without a finite LR has no
rises to speak of (:func:`in_lr_rise` returns None: "no LR recorded").

>>> steps = np.arange(6)
>>> in_lr_rise(steps, np.array([0.0, 1.0, 2.0, 2.0, 2.0, 2.0]), within=3).tolist()
[False, True, True, True, True, False]
"""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = [
    "LR_RISE_TOL",
    "RISE_STEPS",
    "frame_in_lr_rise",
    "in_lr_rise",
    "lr_rise_steps",
    "rows_in_lr_rise",
]

# The share an LR must clear to rise: the run context's (features.context_kernel) rule,
# where schedulers recomputing the LR each step jitter in the last bits without rising.
LR_RISE_TOL = 1e-6
RISE_STEPS = 200  # a rise covers this many steps: the horizon (module docstring)


def _sorted_steps(steps: np.ndarray) -> np.ndarray:
    steps = np.asarray(steps)
    if steps.size > 1 and not np.all(np.diff(steps) > 0):
        raise ValueError(
            "steps must be strictly increasing (one row a step, in order); got "
            f"{steps[:5].tolist()}... Sort the run's rows by step and drop duplicates first"
        )
    return steps


def lr_rise_steps(steps: np.ndarray, lr: np.ndarray, tol: float = LR_RISE_TOL) -> np.ndarray:
    """The logged steps at which the LR rose (module docstring), in order."""
    steps = _sorted_steps(steps)
    lr = np.asarray(lr, dtype=np.float64)
    rises = []
    low = np.nan  # the lowest LR since the last rise
    for step, value in zip(steps.tolist(), lr.tolist(), strict=True):
        if not np.isfinite(value):
            continue
        if value > low + tol * abs(low):  # False while low is NaN: the first LR
            rises.append(step)
            low = value
        elif not value >= low:  # lower, or the first finite LR
            low = value
    return np.asarray(rises, dtype=steps.dtype if steps.size else np.int64)


def in_lr_rise(
    steps: np.ndarray, lr: np.ndarray, within: int = RISE_STEPS, tol: float = LR_RISE_TOL
) -> np.ndarray | None:
    """Per row, whether the step lies in an LR rise; None when no finite LR is logged."""
    if within < 1:
        raise ValueError(f"within must be at least 1 step; got {within}; e.g. {RISE_STEPS}")
    steps = _sorted_steps(steps)
    lr = np.asarray(lr, dtype=np.float64)
    if not np.isfinite(lr).any():
        return None
    rises = lr_rise_steps(steps, lr, tol)
    if not rises.size:
        return np.zeros(steps.size, dtype=bool)
    last = np.searchsorted(rises, steps, side="right") - 1  # the latest rise at or before
    return (last >= 0) & (steps - rises[np.maximum(last, 0)] < within)


def frame_in_lr_rise(frame: pd.DataFrame, within: int = RISE_STEPS) -> np.ndarray | None:
    """:func:`in_lr_rise` of a run frame (``step`` and, where recorded, ``lr``)."""
    if "lr" not in frame:
        return None
    lr = frame["lr"].to_numpy(dtype=np.float64, na_value=np.nan)
    return in_lr_rise(frame["step"].to_numpy(), lr, within)


def rows_in_lr_rise(
    runs: np.ndarray, steps: np.ndarray, frames, within: int = RISE_STEPS
) -> np.ndarray:
    """For rows named by their run (``runs``) and ``steps`` (feature or training rows), whether
    each lies in an LR rise of its run: :func:`frame_in_lr_rise` read at the row's step.
    ``frames``: run id -> the run's frame. False for a run without an LR."""
    runs, steps = np.asarray(runs), np.asarray(steps)
    inside = np.zeros(len(steps), dtype=bool)
    for run_id in np.unique(runs):
        frame = frames[run_id]
        rise = frame_in_lr_rise(frame, within)
        if rise is None:
            continue
        member = np.flatnonzero(runs == run_id)
        at = np.searchsorted(frame["step"].to_numpy(), steps[member])
        inside[member] = rise[np.minimum(at, len(rise) - 1)]
    return inside
