"""A run collapsing now: its latest measured loss or gradient norm is non-finite.

Whatever the forecast says, such a run's answer has level ``critical`` and a ``reason``
saying why (:func:`nonfinite_reason`), while its probability stays the forecast: a loop
that calls the service from another language has no reactive path of its own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["nonfinite_reason", "reasons_of"]

# (signal, companion flag): a NaN with its flag > 0 at that step was measured
_REACTIVE = (("loss", "loss_nonfinite"), ("grad_norm", "grad_nonfinite"))


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
