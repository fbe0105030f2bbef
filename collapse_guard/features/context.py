"""The run context: a streaming accumulator over the whole run so far.

A window of 200 steps cannot know that the LR rose 150 steps ago to twice its peak, or
that the loss has not improved for 500 steps. :class:`RunContext` keeps what it takes to
know (the fields and why each: :mod:`collapse_guard.features.context_fields`) and is
updated once per step, as river's statistics are:

>>> ctx = RunContext.from_schema(model.schema)
>>> for step, record in enumerate(records):      # record = probe.after_step()
...     ctx.update(step, record)
>>> model.predict_window(frame, context=ctx.get())

The offline path (:func:`run_context`, what ``FeatureExtractor.transform_run`` uses
for training rows) feeds a whole run to the same accumulator and reads it at every
window end, so a live run and its run file give the same context to the bit.
It is causal: the context at step t reads only rows with step <= t.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from collapse_guard.features.context_fields import (
    CONTEXT_FIELDS,
    CONTEXT_SIGNALS,
    OPT_IN_CONTEXT,
    context_names,
)
from collapse_guard.features.context_kernel import (
    N_FIELDS,
    advance,
    decays,
    emit,
    fresh_state,
)
from collapse_guard.features.schema import FeatureSchema
from collapse_guard.signals import SIGNAL_NAMES

__all__ = ["RunContext", "context_vector", "opt_in_of", "run_context"]

_INDEX = {name: i for i, (name, _) in enumerate(CONTEXT_FIELDS)}
_KNOWN_KEYS = frozenset(SIGNAL_NAMES) | {"step", "event"}  # a run file's row as a dict
_STATE_KEYS = ("names", "run", "tracks", "early")
_NO_ENDS = np.empty(0, dtype=np.int64)
_DECAY = decays()


@lru_cache(maxsize=32)
def _layout(signals: tuple[str, ...], extra: tuple[str, ...]) -> tuple[tuple[str, ...], np.ndarray]:
    """The context fields of a schema's signals (and opt-in ``extra``) and their
    positions among the emitted fields (cached: a streaming window builds an accumulator
    per call)."""
    names = context_names(signals, extra)
    return names, np.array([_INDEX[n] for n in names], dtype=np.int64)


class RunContext:
    """The run-context fields of one run, updated one step at a time.

    Args:
        signals: the signals of the feature schema (the fields whose signals are among
            them are kept, as ``context_names(signals, extra)``); default every signal.
        extra: opt-in fields to keep too (``context_fields.OPT_IN_CONTEXT``); default none.

    ``update(step, values)`` takes a probe record (signal name -> float, NaN = not
    measured; signals it does not read are ignored) and returns self; ``get()`` gives
    ``{field: value}`` for ``names`` (NaN until known). ``state_dict()`` /
    ``load_state_dict()`` save and restore it (with a checkpoint: a rollback must roll
    the context back too).
    """

    def __init__(self, signals: Sequence[str] = SIGNAL_NAMES, extra: Sequence[str] = ()) -> None:
        self.names, self._pick = _layout(tuple(signals), tuple(extra))
        self.reset()

    @classmethod
    def from_schema(cls, schema: FeatureSchema) -> RunContext:
        """The accumulator of a feature schema's context fields (``schema.context``)."""
        ctx = cls(schema.signals, opt_in_of(schema.context))
        if ctx.names != tuple(schema.context):
            raise ValueError(
                f"schema {schema.fingerprint} has context fields {list(schema.context)}; this "
                f"code computes {list(ctx.names)} for its signals; retrain the model with "
                "this version"
            )
        return ctx

    @property
    def step(self) -> int | None:
        """The last step fed (None before the first)."""
        last = self._run[1]
        return None if math.isnan(last) else int(last)

    def reset(self) -> RunContext:
        """Forget every step (a new run) and return self."""
        self._run, self._tracks, self._early = fresh_state()
        return self

    def update(self, step: int, values: Mapping[str, float]) -> RunContext:
        """Feed the signals of ``step`` (after the previous step) and return self."""
        step = _check_step(step, self.step)
        if not isinstance(values, Mapping):
            raise TypeError(
                f"values must be a mapping of signal name -> float (a probe record); got "
                f"{type(values).__name__}"
            )
        unknown = sorted(str(k) for k in values if k not in _KNOWN_KEYS)
        if unknown:
            raise ValueError(
                f"unknown signal names {unknown}; expected canonical signal names "
                f"(collapse_guard.signals.SIGNAL_NAMES), e.g. {list(CONTEXT_SIGNALS)}"
            )
        column = np.array(
            [[_as_float(values.get(name, math.nan), name)] for name in CONTEXT_SIGNALS]
        )
        self._feed(np.array([step], dtype=np.int64), column, _NO_ENDS)
        return self

    def get(self) -> dict[str, float]:
        """``{name: value}`` at the last step fed (all NaN before the first)."""
        return dict(zip(self.names, self.vector().tolist(), strict=True))

    def vector(self) -> np.ndarray:
        """``get()``'s values as an array, in ``names`` order."""
        out = np.empty(N_FIELDS)
        now = self._run[1]
        emit(self._run, self._tracks, self._early, now, out)
        return out[self._pick]

    def state_dict(self) -> dict[str, Any]:
        """The state as plain lists (JSON-ready but for NaN; ``json`` writes NaN)."""
        return {
            "names": list(self.names),
            "run": self._run.tolist(),
            "tracks": self._tracks.tolist(),
            "early": self._early.tolist(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> RunContext:
        """Restore a :meth:`state_dict` (of an accumulator with the same names)."""
        if set(state) != set(_STATE_KEYS):
            raise ValueError(
                f"a RunContext state has keys {list(_STATE_KEYS)}; got {sorted(state)}; "
                "pass what RunContext.state_dict() returned"
            )
        if tuple(state["names"]) != self.names:
            raise ValueError(
                f"the state is of context fields {list(state['names'])}; this accumulator "
                f"computes {list(self.names)}; build it with the same signals"
            )
        fresh = fresh_state()
        arrays = [np.array(state[k], dtype=np.float64) for k in ("run", "tracks", "early")]
        for key, got, want in zip(("run", "tracks", "early"), arrays, fresh, strict=True):
            if got.shape != want.shape:
                raise ValueError(
                    f"state[{key!r}] has shape {got.shape}; this version keeps {want.shape}; "
                    "the state was saved by another collapse-guard version: start a new "
                    "context (reset) instead"
                )
        self._run, self._tracks, self._early = arrays
        return self

    def _feed(self, steps: np.ndarray, values: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Feed rows (``values``: one row per CONTEXT_SIGNALS) and return the fields at
        each of the sorted ``ends``, ``(len(ends), len(names))``."""
        out = np.empty((len(ends), N_FIELDS))
        advance(self._run, self._tracks, self._early, _DECAY, steps, values, ends, out)
        return out[:, self._pick]

    def __repr__(self) -> str:
        return f"RunContext(fields={len(self.names)}, step={self.step})"


def opt_in_of(names: Sequence[str]) -> tuple[str, ...]:
    """The opt-in fields among context field ``names`` (what a schema asked for)."""
    return tuple(n for n in names if n in OPT_IN_CONTEXT)


def run_context(
    signals: Sequence[str],
    steps: np.ndarray,
    values: np.ndarray,
    ends: np.ndarray,
    extra: Sequence[str] = (),
) -> np.ndarray:
    """The context at each of ``ends`` (sorted steps) of a whole run: a fresh
    :class:`RunContext` fed every row, read at each end.

    Args:
        signals: the schema's signals (which fields are kept).
        steps: strictly increasing int64 steps of the run's rows.
        values: ``(len(CONTEXT_SIGNALS), rows)`` float64, NaN = not measured.
        ends: sorted int64 steps; each end's fields use the rows with step <= end.
        extra: the opt-in fields to keep too.

    Returns:
        ``(len(ends), len(context_names(signals, extra)))`` float64.
    """
    ctx = RunContext(signals, extra)
    return ctx._feed(
        np.ascontiguousarray(steps, dtype=np.int64),
        np.ascontiguousarray(values, dtype=np.float64),
        np.ascontiguousarray(ends, dtype=np.int64),
    )


def context_vector(context: Mapping[str, float], names: Sequence[str]) -> np.ndarray:
    """A context mapping as a vector in ``names`` order: a missing name is NaN (not
    known, as LightGBM reads it); an unknown one is a ValueError."""
    if not isinstance(context, Mapping):
        raise TypeError(
            f"context must be a mapping of context field -> float (RunContext.get()); got "
            f"{type(context).__name__}"
        )
    known = set(names)
    unknown = sorted(str(k) for k in context if k not in known)
    if unknown:
        raise ValueError(
            f"unknown context fields {unknown}; this schema's context fields are "
            f"{list(names)}; send RunContext.from_schema(schema).get() or a subset of it"
        )
    return np.array([_as_float(context.get(n, math.nan), n) for n in names], dtype=np.float64)


def _as_float(value: Any, name: str) -> float:
    if value is None:  # JSON's "unknown" (it has no NaN), as a run file's writer reads it
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number (NaN if unknown); got {value!r}") from None


def _check_step(step: Any, last: int | None) -> int:
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
        if not (isinstance(step, (float, np.floating)) and float(step).is_integer()):
            raise TypeError(f"step must be an integer training step; got {step!r}")
    step = int(step)
    if last is not None and step <= last:
        raise ValueError(
            f"steps must increase: got step {step} after step {last}; call reset() for a "
            "new run, or load_state_dict() a saved state to roll back"
        )
    return step
