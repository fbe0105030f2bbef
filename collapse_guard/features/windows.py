"""From a run frame to windows on a dense step grid.

The window rule: the window ending at step ``t`` holds steps ``t - W + 1 .. t``, one
row per step, whatever the frame's rows are. Steps with no row (gaps in a log, steps
before the run's first row) are NaN rows. So a window always spans exactly ``W``
steps of training, a signal measured every 50 steps shows up as values 50 rows apart,
and the window at the start of a run is NaN-padded in front. Streaming and batch build
windows with the same function (:func:`dense_grid`), so they hand the kernel the same
numbers.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pandas as pd

__all__ = ["check_steps", "dense_grid", "frame_arrays", "window_blocks"]

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


def dense_grid(steps: np.ndarray, values: np.ndarray, first: int, last: int) -> np.ndarray:
    """``(n_signals, last - first + 1)`` values on every step of ``first..last``.

    ``steps`` are strictly increasing; rows outside the range are dropped, steps
    without a row are NaN.
    """
    lo, hi = np.searchsorted(steps, [first, last + 1])
    grid = np.full((values.shape[0], last - first + 1), np.nan, dtype=np.float64)
    grid[:, steps[lo:hi] - first] = values[:, lo:hi]
    return grid


def window_blocks(
    steps: np.ndarray, values: np.ndarray, ends: np.ndarray, window: int, block: int
) -> Iterator[tuple[slice, np.ndarray]]:
    """Yield ``(slice of ends, windows (b, window, n_signals))`` for sorted ``ends``.

    Only one block's span of the dense grid exists at a time, so memory stays
    ``n_signals x (block span + window)`` however long the run is.
    """
    for a in range(0, len(ends), block):
        part = ends[a : a + block]
        first = int(part[0]) - window + 1
        grid = dense_grid(steps, values, first, int(part[-1]))
        view = np.lib.stride_tricks.sliding_window_view(grid, window, axis=1)
        yield slice(a, a + len(part)), view[:, part - part[0]].transpose(1, 2, 0)
