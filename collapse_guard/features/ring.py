"""The live window: a preallocated ring of the last ``W`` steps' signals.

The guard appends one row a step and asks for a risk every ``risk_every`` steps. A ring
of ``(W, n_signals)`` float64 takes the row in place (no list of rows, no DataFrame);
:meth:`SignalRing.window` hands out the rows oldest first as a :class:`SignalWindow`,
which the extractor scores through :meth:`FeatureExtractor.transform_array` (the same
kernel as a frame's window: tests/features/test_ring.py proves it bit for bit) and
which is also a mapping ``{"step": steps, signal: column}`` that the service client
sends as it is.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["SignalRing", "SignalWindow", "window_risk"]


class SignalWindow(Mapping):
    """Rows of a window, oldest first: ``steps`` (n,) int64, ``values`` (n, signals)."""

    def __init__(self, steps: np.ndarray, values: np.ndarray, signals: Sequence[str]) -> None:
        self.steps, self.values, self.signals = steps, values, tuple(signals)
        self._column = {name: i for i, name in enumerate(self.signals)}

    def __getitem__(self, key: str) -> np.ndarray:
        if key == "step":
            return self.steps
        return self.values[:, self._column[key]]

    def __iter__(self) -> Iterator[str]:
        return iter(("step", *self.signals))

    def __len__(self) -> int:
        return len(self.signals) + 1

    def columns(self, signals: Sequence[str]) -> np.ndarray:
        """``(n, len(signals))`` in that order; a signal the window lacks is all NaN."""
        out = np.full((len(self.steps), len(signals)), np.nan)
        for j, name in enumerate(signals):
            i = self._column.get(name)
            if i is not None:
                out[:, j] = self.values[:, i]
        return out

    def frame(self):
        """As a DataFrame (``step`` then the signals), for models that read frames."""
        import pandas as pd

        frame = pd.DataFrame(self.values, columns=list(self.signals))
        frame.insert(0, "step", self.steps)
        return frame


class SignalRing:
    """The last ``capacity`` rows of ``signals``, kept in a preallocated array."""

    def __init__(self, capacity: int, signals: Sequence[str]) -> None:
        if capacity < 1:
            raise ValueError(f"a window holds at least one step; got capacity {capacity}")
        self.capacity, self.signals = int(capacity), tuple(signals)
        self._steps = np.zeros(self.capacity, dtype=np.int64)
        self._values = np.full((self.capacity, len(self.signals)), np.nan)
        self.count = 0  # rows ever appended since the last clear

    def __len__(self) -> int:
        return min(self.count, self.capacity)

    def clear(self) -> None:
        self.count = 0

    def append(self, step: int, row: Sequence[float]) -> None:
        """One step's values, in ``signals`` order (older rows fall out past capacity)."""
        at = self.count % self.capacity
        self._steps[at] = step
        self._values[at] = row
        self.count += 1

    def _order(self) -> np.ndarray | slice:
        if self.count <= self.capacity:
            return slice(0, self.count)
        start = self.count % self.capacity
        return np.r_[start : self.capacity, 0:start]

    def window(self) -> SignalWindow:
        """The rows oldest first, copied (later appends do not change it)."""
        order = self._order()
        return SignalWindow(self._steps[order].copy(), self._values[order].copy(), self.signals)

    def state(self) -> tuple[list[int], list[list[float]]]:
        """``(steps, rows)`` as plain lists (a checkpoint that loads with weights_only)."""
        window = self.window()
        return window.steps.tolist(), window.values.tolist()

    def load(self, steps: Sequence[int], rows: Sequence[Sequence[float]]) -> None:
        """Replace the contents by ``steps`` and ``rows`` (the last ``capacity`` kept)."""
        if len(steps) != len(rows):
            raise ValueError(f"{len(steps)} steps for {len(rows)} rows; expected one each")
        self.clear()
        for step, row in zip(steps[-self.capacity :], rows[-self.capacity :], strict=True):
            self.append(int(step), row)


def window_risk(model: Any, window: SignalWindow, context: Mapping[str, float] | None) -> float:
    """P(collapse) of ``model`` for ``window``: through the extractor's array path when the
    model has one (a ``RiskModel``), else its ``predict_window`` on the window's frame."""
    extractor = getattr(model, "extractor", None)
    if extractor is None or not hasattr(model, "predict_features"):
        return float(model.predict_window(window.frame(), context=context))
    vec = extractor.transform_array(window.columns(extractor.signals), window.steps, context)
    return float(model.predict_features(vec[np.newaxis, :])[0])
