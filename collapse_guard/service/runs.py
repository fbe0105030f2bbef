"""Checked run windows: what the scoring code receives, whatever the wire format.

JSON (:func:`from_json_run`) and Arrow (:mod:`collapse_guard.service.arrow_codec`) both
end in :func:`check_window`, so a window is held to the same rules, with the same
messages, however it arrived. Signal names are the canonical ones
(:data:`collapse_guard.signals.SIGNAL_NAMES`): a canonical signal the model does not
read is accepted and ignored (the probe sends them all); any other name is rejected.

A run whose latest measured loss or gradient norm is non-finite is collapsing now,
whatever the forecast says (:func:`nonfinite_reason`): the answer's level is
``critical`` and its ``reason`` says why, while its probability stays the forecast. A
loop that calls the service from another language has no reactive path of its own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from collapse_guard.features.context import context_vector
from collapse_guard.service.errors import BadRequest
from collapse_guard.service.limits import Limits
from collapse_guard.signals import SIGNAL_NAMES

__all__ = [
    "MAX_STEP",
    "RawRun",
    "RunWindow",
    "WindowBatch",
    "check_batch_size",
    "check_window",
    "from_json_run",
    "nonfinite_reason",
    "reasons_of",
    "steps_in_range",
]

# |step| at most 2**53: exact in float64, which frames, run files and the run context
# hold steps in, and far from int64's ends, so that differences of steps cannot overflow
MAX_STEP = 2**53
# (signal, companion flag): a NaN with its flag > 0 at that step was measured
_REACTIVE = (("loss", "loss_nonfinite"), ("grad_norm", "grad_nonfinite"))


@dataclass(frozen=True)
class RawRun:
    """One run as a caller holds it or a body carries it, before any check: steps,
    columns, optional context (None: not known)."""

    run_id: str
    steps: Any
    columns: Mapping[str, Any]
    context: Mapping[str, float | None] | None = None


_KNOWN = frozenset(SIGNAL_NAMES)


@dataclass(frozen=True)
class RunWindow:
    """One run's window: int64 steps, float64 columns (model signals only), context."""

    run_id: str
    steps: np.ndarray
    columns: dict[str, np.ndarray]
    context: dict[str, float] = field(default_factory=dict)
    reason: str | None = None  # nonfinite_reason of the raw columns

    def frame(self) -> pd.DataFrame:
        """``step`` plus the signal columns, as ``RiskModel`` reads a run."""
        return pd.DataFrame({"step": self.steps, **self.columns}, copy=False)


@dataclass(frozen=True)
class WindowBatch:
    """A request's checked runs end to end: one array per signal over every run's rows.

    This is how an Arrow stream arrives (decoded without a copy per run), and what the
    scoring code reads: a batch becomes its feature grid in one gather per signal rather
    than one write per (run, signal) (64 runs: ~1,500 numpy calls, ~2.5 ms here).
    """

    run_ids: list[str]
    steps: np.ndarray  # int64, every run's rows, run after run; strictly increasing in a run
    bounds: np.ndarray  # int64 (len(run_ids) + 1,): run i is rows bounds[i]:bounds[i + 1]
    columns: dict[str, np.ndarray]  # model signal -> float64 over every row (absent: NaN)
    contexts: np.ndarray  # float64 (len(run_ids), n_context_fields); NaN = not given
    # per run: why it is collapsing now whatever the forecast (nonfinite_reason), or None
    reasons: list[str | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.run_ids)

    @property
    def last_steps(self) -> np.ndarray:
        """Each run's last step: the step its answer refers to."""
        return self.steps[self.bounds[1:] - 1]

    @classmethod
    def of(cls, windows: Sequence[RunWindow], context_fields: Sequence[str]) -> WindowBatch:
        """The windows laid end to end (a signal a window lacks is NaN on its rows)."""
        lengths = [len(w.steps) for w in windows]
        names = dict.fromkeys(n for w in windows for n in w.columns)  # first-seen order
        columns = {
            name: np.concatenate(
                [w.columns.get(name, np.full(len(w.steps), np.nan)) for w in windows]
            )
            for name in names
        }
        contexts = [context_vector(w.context, context_fields) for w in windows]
        return cls(
            run_ids=[w.run_id for w in windows],
            steps=np.concatenate([w.steps for w in windows]).astype(np.int64, copy=False),
            bounds=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
            columns=columns,
            contexts=np.array(contexts, dtype=np.float64).reshape(len(windows), -1),
            reasons=[w.reason for w in windows],
        )


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


def nonfinite_reason(steps: np.ndarray, columns: Mapping[str, Any]) -> str | None:
    """Why a run is collapsing now, or None: its latest measured ``loss`` or
    ``grad_norm`` is NaN or infinite.

    Measured: a finite value or +-inf; a NaN where its companion flag
    (``loss_nonfinite``, ``grad_nonfinite``) is > 0 at that row, or where it is a float
    in a list (the general JSON reader's ``"NaN"``; its ``null`` is None). In an array
    a NaN cannot tell "measured NaN" from "not measured" (the probe's and run files'
    convention: NaN = not measured), so there only the flag says it was measured.
    """
    n = len(steps)
    arrays = {}
    for name, flag in _REACTIVE:
        values = columns.get(name)
        if isinstance(values, list) and len(values) == n:
            flags = _column(columns, flag, n)
            i = _latest_in_list(values, flags)
            latest = math.nan if i is None or values[i] is None else values[i]
            if i is not None and not math.isfinite(latest):
                return _reason(name, latest, steps[i])
        elif values is not None:
            arrays[name] = values
            if flag in columns:
                arrays[flag] = columns[flag]
    if not arrays:
        return None
    return reasons_of(steps, np.array([0, n]), arrays)[0]


def reasons_of(
    steps: np.ndarray, bounds: np.ndarray, columns: Mapping[str, Any]
) -> list[str | None]:
    """:func:`nonfinite_reason` of every run of a batch laid end to end (arrays), in one
    pass per signal: the latest measured row of each run by one ``maximum.reduceat``."""
    out: list[str | None] = [None] * (len(bounds) - 1)
    n = len(steps)
    for name, flag in _REACTIVE:
        values = _column(columns, name, n)
        if values is None or not len(values) or np.isfinite(values[bounds[1:] - 1]).all():
            continue  # every run's last row measured and finite (the usual): none here
        measured = ~np.isnan(values)
        flags = _column(columns, flag, n)
        if flags is not None:
            measured |= flags > 0
        rows = np.where(measured, np.arange(n), -1)
        latest = np.maximum.reduceat(rows, bounds[:-1])  # -1: no measurement in the run
        bad = (latest >= 0) & ~np.isfinite(values[np.maximum(latest, 0)])
        for run in np.flatnonzero(bad).tolist():
            if out[run] is None:  # loss first: the reason a user looks at first
                out[run] = _reason(name, values[latest[run]], steps[latest[run]])
    return out


def _column(columns: Mapping[str, Any], name: str, n: int) -> np.ndarray | None:
    # a column of the wrong length is check_window's to name: not read here
    values = columns.get(name)
    if values is None or len(values) != n:
        return None
    return np.asarray(values, dtype=np.float64)


def _latest_in_list(values: list, flags: np.ndarray | None) -> int | None:
    for i in range(len(values) - 1, -1, -1):  # usually the last row: one look
        if values[i] is not None or (flags is not None and flags[i] > 0):
            return i
    return None


def _reason(name: str, value: float | None, step: int) -> str:
    value = math.nan if value is None else float(value)
    return (
        f"{name} is {value} at step {int(step)}, its latest measurement: the run is "
        "collapsing now, whatever the forecast (probability)"
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
