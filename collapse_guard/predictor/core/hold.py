"""The risk hold: a run's risk at a step is the highest window risk of its last few steps.

A window's risk flickers around a level as the window slides: on held-out families, at
the stored `warn` level, most false alarms came in bursts of 2-9 episodes on the same
run (benchmarks/README.md, "The shipped model", 1.). A loop alarms on the
risk held over ``hold_steps`` steps, so a flicker is one alarm, not five; the model's
levels are set on the same held risk (``train.set_levels``), so they keep their
false-alarm budgets under it. Leave-one-family-out, a 50-step hold caught more of the
collapses that develop at `warn` with fewer false alarms (benchmarks/README.md, "The
shipped model", 1.).

One code path for a run file and a live loop: :func:`hold_risk` streams a run's risks
through :class:`RiskHold`, as the guard does with each answer it gets.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["DEFAULT_HOLD_STEPS", "MAX_HOLD_STEPS", "RiskHold", "hold_risk"]

# 50 steps: of 25, 50 and 100, the fewest false alarms on held-out families at about the
# same recall (benchmarks/README.md, "The shipped model", 1.)
DEFAULT_HOLD_STEPS = 50
# The longest hold a model or a served answer may carry (the model loader, the client and
# the guard all refuse more): longer than a long run's window of interest is no model's;
# the shipped model holds 50 steps, the horizon its levels are for is 200
MAX_HOLD_STEPS = 10_000


class RiskHold:
    """The highest risk of the last ``steps`` steps (this one included), streamed.

    ``update(step, p, item)`` takes each answer in step order and returns the held
    ``(p, item)``: the highest ``p`` in ``(step - steps, step]`` and what came with it
    (the guard passes the answer's level, so the held level is that answer's). NaN (no
    opinion yet) never holds; with no finite risk in the window the answer is NaN.
    ``steps`` <= 1 holds nothing: each answer is returned as it came.
    """

    def __init__(self, steps: int) -> None:
        if steps < 0:
            raise ValueError(f"hold steps must be >= 0, got {steps}")
        self.steps = int(steps)
        # (step, p, item) with p strictly falling: the head is the window's highest
        self._recent: deque[tuple[int, float, Any]] = deque()

    def update(self, step: int, p: float, item: Any = None) -> tuple[float, Any]:
        if self.steps <= 1:
            return p, item
        if not math.isnan(p):
            while self._recent and self._recent[-1][1] <= p:
                self._recent.pop()
            self._recent.append((step, p, item))
        while self._recent and self._recent[0][0] <= step - self.steps:
            self._recent.popleft()
        if not self._recent:
            return math.nan, item
        _, held, held_item = self._recent[0]
        return held, held_item

    def state_dict(self) -> dict[str, Any]:
        """Plain values (a checkpoint loads them with ``weights_only=True``)."""
        return {"steps": self.steps, "recent": [list(entry) for entry in self._recent]}

    def load_state_dict(self, state: dict[str, Any]) -> RiskHold:
        self.steps = int(state["steps"])
        self._recent = deque((int(s), float(p), item) for s, p, item in state["recent"])
        return self


def hold_risk(steps: Sequence[int] | np.ndarray, risk: np.ndarray, hold_steps: int) -> np.ndarray:
    """A run's risks (one per step, steps rising) held over ``hold_steps`` steps."""
    hold = RiskHold(hold_steps)
    return np.array(
        [hold.update(int(s), float(p))[0] for s, p in zip(steps, risk, strict=True)],
        dtype=np.float64,
    )
