"""A run as a caller holds it, before any check: what the client sends and a body carries.

:func:`as_raw_run` takes a pandas frame of a run's recent steps (a ``step`` column plus
signal columns, as the probe's records or a run file give them; ``event`` is dropped) or
a dict of arrays with the same keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["RawRun", "as_raw_run"]

_NOT_SIGNALS = frozenset({"step", "steps", "event"})


@dataclass(frozen=True)
class RawRun:
    """One run as a caller holds it or a body carries it, before any check: steps,
    columns, optional context (None: not known)."""

    run_id: str
    steps: Any
    columns: Mapping[str, Any]
    context: Mapping[str, float | None] | None = None


def as_raw_run(run: Any, run_id: str, context: Mapping[str, float | None] | None = None) -> RawRun:
    """A frame (``step`` + signal columns) or a dict of arrays as a :class:`RawRun`."""
    if hasattr(run, "columns") and hasattr(run, "to_numpy"):  # a pandas DataFrame
        every = run.columns.tolist()  # once: pandas 3 iterates an Arrow-backed index slowly
        if "step" not in every:
            raise ValueError(
                f"run {run_id!r}: expected a 'step' column plus signal columns; got "
                f"{every[:10]}; add the step counter (frame.reset_index())"
            )
        names = [c for c in every if c not in _NOT_SIGNALS]
        # the whole frame in one conversion when it holds only numbers: pandas 3 takes
        # ~25 us to hand out each column (0.6 ms a window here), the whole block 16 us;
        # the steps come out of it too (exact: float64 holds whole numbers to 2**53)
        kept = every if len(names) == len(every) - 1 else ["step", *names]
        numeric = run if kept is every else run[kept]
        block = np.ascontiguousarray(numeric.to_numpy(dtype=np.float64, na_value=np.nan).T)
        position = {c: i for i, c in enumerate(kept)}
        steps = block[position["step"]]
        columns = {str(c): block[position[c]] for c in names}
    elif isinstance(run, Mapping):
        key = "step" if "step" in run else "steps"
        if key not in run:
            raise ValueError(
                f"run {run_id!r}: expected a 'step' array plus one array per signal; got "
                f"keys {sorted(run)[:10]}"
            )
        steps = np.asarray(run[key])
        columns = {
            str(k): np.asarray(v, dtype=np.float64) for k, v in run.items() if k not in _NOT_SIGNALS
        }
    else:
        raise TypeError(
            f"run {run_id!r}: expected a pandas DataFrame or a dict of arrays; got "
            f"{type(run).__name__}"
        )
    return RawRun(run_id, np.asarray(steps, dtype=np.int64), columns, context)
