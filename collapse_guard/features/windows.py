"""From a run frame to windows on a dense step grid.

The window rule: the window ending at step ``t`` holds steps ``t - W + 1 .. t``, one
row per step, whatever the frame's rows are. Steps with no row (gaps in a log, steps
before the run's first row) are NaN rows. So a window always spans exactly ``W``
steps of training, a signal measured every 50 steps shows up as values 50 rows apart,
and the window at the start of a run is NaN-padded in front. Streaming and batch build
windows with the same function (:func:`dense_grid`), so they hand the kernel the same
numbers.

Batch hands the kernel one block of a run at a time (:func:`grid_blocks`): the grid of
the steps the block's windows cover, and the column of each window's "now". A
streaming window is the same with a ``W``-column grid and one end.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pandas as pd

__all__ = [
    "check_signal_columns",
    "check_steps",
    "dense_grid",
    "frame_arrays",
    "frame_tail",
    "grid_blocks",
]

_SORT_HINT = "sort by step and keep one row per step, e.g. frame.sort_values('step')" + (
    ".drop_duplicates('step', keep='last')"
)


def check_steps(steps: np.ndarray | Sequence[int]) -> np.ndarray:
    """Steps as int64, or ValueError unless they are strictly increasing integers."""
    raw = np.asarray(steps)
    if raw.ndim != 1:
        raise ValueError(f"steps must be one-dimensional; got shape {raw.shape}")
    if raw.dtype.kind not in "iu":
        if raw.dtype.kind != "f" or not (np.isfinite(raw).all() and (raw == np.round(raw)).all()):
            raise ValueError(
                f"steps must be integers; got dtype {raw.dtype} with values like "
                f"{raw[:3].tolist()}; pass the training step counter as integers"
            )
    out = raw.astype(np.int64)
    bad = np.flatnonzero(np.diff(out) <= 0)
    if bad.size:
        i = int(bad[0])
        what = "a duplicate of" if out[i + 1] == out[i] else "smaller than"
        raise ValueError(
            "steps must be strictly increasing (one row per step); got step "
            f"{out[i + 1]} at row {i + 1}, {what} step {out[i]} at row {i}; {_SORT_HINT}"
        )
    return out


def _folded(name: object) -> str:
    # how a column may be misspelt and still mean a signal: case and separators
    return str(name).strip().lower().replace("-", "_").replace(" ", "_").replace("/", "_")


def check_signal_columns(columns: Sequence[object], signals: Sequence[str]) -> None:
    """UserInputError unless the columns hold at least one of ``signals`` and none that
    looks like a signal spelt otherwise (``Loss``, ``grad-norm``).

    Either mistake would otherwise score a run whose signals are all missing: NaN
    features, and a low risk that reads as "all is well" (issue 21: 0.041 for a run whose
    loss column was ``Loss``). Columns that are neither (``event``, anything else) pass.
    """
    from collapse_guard.errors import UserInputError
    from collapse_guard.signals import SIGNAL_NAMES

    names = set(map(str, columns))
    canonical = {_folded(s): s for s in SIGNAL_NAMES}
    lookalikes = {
        c: canonical[_folded(c)]
        for c in sorted(names - set(SIGNAL_NAMES))
        if _folded(c) in canonical
    }
    if not lookalikes and names & set(signals):
        return
    expected = ", ".join(signals)
    if lookalikes:
        renames = ", ".join(f"{c!r} -> {s!r}" for c, s in lookalikes.items())
        raise UserInputError(
            f"unknown column(s) {sorted(lookalikes)} look like signals spelt otherwise "
            f"(names are case-sensitive); expected signal columns among: {expected}",
            f"rename them: {renames}",
        )
    others = sorted(names - {"step"})
    raise UserInputError(
        f"the frame has none of the signal columns the features read; got columns "
        f"{others}; expected signal columns among: {expected}",
        "name the columns as the probe writes them (collapse_guard.signals), e.g. 'loss'",
    )


def frame_arrays(frame: pd.DataFrame, signals: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)``: int64 steps and ``(n_signals, rows)`` float64 values.

    Signal columns the frame lacks are all NaN; columns that are not signals (``event``,
    anything else) are ignored.
    """
    if not isinstance(frame, pd.DataFrame) or "step" not in frame.columns:
        got = list(frame.columns) if isinstance(frame, pd.DataFrame) else type(frame).__name__
        raise ValueError(
            f"expected a DataFrame with a 'step' column plus signal columns; got {got}; "
            "add the step counter as column 'step' (e.g. frame.reset_index() if it is the index)"
        )
    if len(frame):  # an empty frame has its own error (the extractor's)
        check_signal_columns(frame.columns, signals)
    steps = check_steps(frame["step"].to_numpy())
    values = np.full((len(signals), len(steps)), np.nan, dtype=np.float64)
    present = [i for i, s in enumerate(signals) if s in frame.columns]
    if present:
        block = frame[[signals[i] for i in present]]
        try:
            values[present] = block.to_numpy(dtype=np.float64, na_value=np.nan).T
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"signal columns must be numeric; got dtypes {dict(block.dtypes.astype(str))}; "
                "convert them with pd.to_numeric"
            ) from exc
    return steps, values


def frame_tail(
    frame: pd.DataFrame, signals: Sequence[str], rows: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`frame_arrays` of the frame's last ``rows`` rows, without building frames.

    One window of ``rows`` steps can only hold the last ``rows`` rows (steps are
    strictly increasing), so only those are read and checked. Column positions are
    cached for frames that share their columns (``Index.is_``: slices of one frame);
    plain numpy columns are read directly. Anything else (extension dtypes, duplicate
    column names, an old or new pandas) takes :func:`frame_arrays`, which has the
    error messages.
    """
    if not isinstance(frame, pd.DataFrame) or "step" not in frame.columns or not len(frame):
        return frame_arrays(frame, signals)
    positions = _positions(frame.columns, tuple(signals))
    start = max(len(frame) - rows, 0)
    try:
        if positions is None:
            raise TypeError("not plain columns")
        step_col = _column(frame, positions[0])
        try:
            steps = check_steps(step_col[start:])
        except ValueError:
            check_steps(step_col)  # the same error, with row numbers of the whole frame
            raise
        values = np.full((len(signals), len(steps)), np.nan, dtype=np.float64)
        for i, j in enumerate(positions[1:]):
            if j >= 0:
                values[i] = _column(frame, j)[start:]
    except TypeError:
        return frame_arrays(frame.iloc[start:], signals)
    return steps, values


_POSITIONS: dict[tuple[str, ...], tuple[pd.Index, list[int] | None]] = {}


def _positions(columns: pd.Index, signals: tuple[str, ...]) -> list[int] | None:
    """Column positions of ``step`` then each signal (-1 when absent); None when a name
    is not a unique column. The last columns seen per signal tuple are cached."""
    cached = _POSITIONS.get(signals)
    if cached is not None and cached[0].is_(columns):
        return cached[1]
    check_signal_columns(columns, signals)  # once per set of columns: cached below
    positions: list[int] | None = []
    for name in ("step", *signals):
        loc = columns.get_loc(name) if name in columns else -1
        if not isinstance(loc, int):
            positions = None
            break
        positions.append(loc)
    if len(_POSITIONS) > 64:
        _POSITIONS.clear()
    _POSITIONS[signals] = (columns, positions)
    return positions


def _column(frame: pd.DataFrame, j: int) -> np.ndarray:
    """Column ``j`` as its numpy array (no copy), or TypeError unless plain numeric."""
    # pandas' own per-column accessor: frame.iloc[:, j] builds a Series (~50x slower)
    getter = getattr(frame, "_get_column_array", None)
    arr = getter(j) if getter is not None else None
    if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "iufb":
        raise TypeError(f"column {j} is not a plain numeric numpy column")
    return arr


def dense_grid(steps: np.ndarray, values: np.ndarray, first: int, last: int) -> np.ndarray:
    """``(n_signals, last - first + 1)`` values on every step of ``first..last``.

    ``steps`` are strictly increasing; rows outside the range are dropped, steps
    without a row are NaN.
    """
    lo, hi = np.searchsorted(steps, [first, last + 1])
    grid = np.full((values.shape[0], last - first + 1), np.nan, dtype=np.float64)
    if hi > lo and steps[hi - 1] - steps[lo] == hi - lo - 1:
        # one row per step (the usual log): a slice, ~3x cheaper than scattering columns
        at = steps[lo] - first
        grid[:, at : at + hi - lo] = values[:, lo:hi]
    else:
        grid[:, steps[lo:hi] - first] = values[:, lo:hi]
    return grid


def grid_blocks(
    steps: np.ndarray, values: np.ndarray, ends: np.ndarray, window: int, block: int
) -> Iterator[tuple[slice, np.ndarray, np.ndarray]]:
    """Yield ``(slice of ends, grid (n_signals, span), ends as grid columns)`` for
    sorted ``ends``, ``block`` ends at a time.

    Only one block's span of the dense grid exists at a time, so memory stays
    ``n_signals x (block span + window)`` however long the run is.
    """
    for a in range(0, len(ends), block):
        part = ends[a : a + block]
        first, last = int(part[0]) - window + 1, int(part[-1])
        yield slice(a, a + len(part)), dense_grid(steps, values, first, last), part - first
