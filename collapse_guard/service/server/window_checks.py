"""The checks every run window passes, whatever the wire format.

JSON (:func:`from_json_run`) and Arrow
(:mod:`collapse_guard.service.server.arrow_reader`) both end in :func:`check_window`, so
a window is held to the same rules, with the same messages, however it arrived. Signal
names are the canonical ones (:data:`collapse_guard.signals.SIGNAL_NAMES`): a canonical
signal the model does not read is accepted and ignored (the probe sends them all); any
other name is rejected.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from collapse_guard.service.client.raw_run import RawRun
from collapse_guard.service.middleware.bad_request import BadRequest
from collapse_guard.service.middleware.limits import Limits
from collapse_guard.service.server.collapse_now import nonfinite_reason
from collapse_guard.service.server.windows import RunWindow
from collapse_guard.signals import SIGNAL_NAMES

__all__ = [
    "MAX_STEP",
    "check_batch_size",
    "check_window",
    "from_json_run",
    "steps_in_range",
]

# |step| at most 2**53: exact in float64, which frames, run files and the run context
# hold steps in, and far from int64's ends, so that differences of steps cannot overflow
MAX_STEP = 2**53
_KNOWN = frozenset(SIGNAL_NAMES)


def check_batch_size(n_runs: int, limits: Limits, where: str = "runs") -> None:
    """BadRequest unless 1 <= n_runs <= limits.max_runs."""
    if n_runs < 1:
        raise BadRequest(where, "no runs", "at least one run", "add a run to the request")
    if n_runs > limits.max_runs:
        raise BadRequest(
            where,
            f"{n_runs} runs",
            f"at most {limits.max_runs} runs per request",
            "split the batch into several requests",
        )


def check_window(
    where: str,
    run_id: str,
    steps: np.ndarray,
    columns: Mapping[str, np.ndarray],
    context: Mapping[str, float | None] | None,
    *,
    signals: Sequence[str],
    context_fields: Sequence[str],
    limits: Limits,
) -> RunWindow:
    """Check one window against the model's signals and context fields and the limits.

    ``where`` prefixes field names in errors (``runs[3]``). Returns the model's signal
    columns only, each float64 of the steps' length.
    """
    n = len(steps)
    if n < 1:
        raise BadRequest(f"{where}.steps", "no steps", "at least one step", "send the window")
    if n > limits.max_steps:
        raise BadRequest(
            f"{where}.steps",
            f"{n} steps",
            f"at most {limits.max_steps} steps per run",
            "send the last steps only (the model reads the last window of them)",
        )
    steps = _check_steps(f"{where}.steps", steps)
    unknown = sorted(set(columns) - _KNOWN)
    if unknown:
        raise BadRequest(
            f"{where}.signals.{unknown[0]}",
            f"unknown signal name{'s' if len(unknown) > 1 else ''} {unknown}",
            f"canonical names: {', '.join(SIGNAL_NAMES)}",
            "rename the column (the probe's record keys are the canonical names)",
        )
    out: dict[str, np.ndarray] = {}
    for name in signals:
        if name not in columns:
            continue
        values = np.asarray(columns[name], dtype=np.float64)
        _check_length(where, name, len(values), n)
        out[name] = values
    context = _check_context(where, context, context_fields)
    return RunWindow(run_id, steps, out, context, nonfinite_reason(steps, columns))


def from_json_run(
    where: str,
    run: RawRun,
    *,
    signals: Sequence[str],
    context_fields: Sequence[str],
    limits: Limits,
) -> RunWindow:
    """A checked window from a JSON run (lists, or arrays from json_reader)."""
    # lengths first: a column of the wrong length must not cost a conversion
    n = len(run.steps)
    for name, values in run.columns.items():
        if name in _KNOWN:
            _check_length(where, name, len(values), n)
    return check_window(
        where,
        run.run_id,
        run.steps,
        run.columns,
        run.context,
        signals=signals,
        context_fields=context_fields,
        limits=limits,
    )


def _check_length(where: str, name: str, got: int, n: int) -> None:
    if got != n:
        raise BadRequest(
            f"{where}.signals.{name}",
            f"{got} values for {n} steps",
            "one value per step (null where not measured)",
            "pad the column with null to the length of steps",
        )


def _check_steps(where: str, steps: Any) -> np.ndarray:
    steps = steps_in_range(where, steps)
    bad = np.flatnonzero(steps[1:] <= steps[:-1])
    if bad.size:
        i = int(bad[0])
        raise BadRequest(
            f"{where}[{i + 1}]",
            f"step {int(steps[i + 1])} after step {int(steps[i])}",
            "strictly increasing steps (one row per step)",
            "sort the rows by step and drop duplicate steps",
        )
    return steps


def steps_in_range(where: str, steps: Any) -> np.ndarray:
    """int64 steps, each whole and within +-MAX_STEP (BadRequest naming the first that
    is not; the values themselves, never their wrapped int64)."""
    if isinstance(steps, list):  # the general JSON reader's Python ints: any size
        first = next((i for i, x in enumerate(steps) if not -MAX_STEP <= x <= MAX_STEP), None)
        if first is not None:
            _outside(f"{where}[{first}]", steps[first])
    steps = np.asarray(steps)
    if steps.dtype.kind not in "iu":
        raise BadRequest(where, f"values of type {steps.dtype}", "whole numbers", "send integers")
    outside = steps > MAX_STEP
    if steps.dtype.kind == "i":  # uint64 has no negative steps (and no overflow below 0)
        outside |= steps < -MAX_STEP
    rows = np.flatnonzero(outside)
    if rows.size:
        _outside(f"{where}[{rows[0]}]", int(steps[rows[0]]))
    return steps.astype(np.int64, copy=False)


def _outside(where: str, step: int) -> None:
    raise BadRequest(
        where,
        f"step {step}",
        f"a step between -{MAX_STEP} and {MAX_STEP} (2**53)",
        "send the training step counter as it is",
    )


def _check_context(
    where: str, context: Mapping[str, float | None] | None, fields: Sequence[str]
) -> dict[str, float]:
    if not context:
        return {}
    unknown = sorted(set(context) - set(fields))
    if unknown:
        known = ", ".join(fields) if fields else "none (this model reads no context)"
        raise BadRequest(
            f"{where}.context.{unknown[0]}",
            f"unknown context field{'s' if len(unknown) > 1 else ''} {unknown}",
            f"the model's context fields: {known}",
            "drop or rename them (GET /model lists schema.context)",
        )
    # null = not known: left out, so the feature is NaN exactly as for an absent key
    return {k: float(v) for k, v in context.items() if v is not None}
