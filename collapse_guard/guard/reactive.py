"""The reactive path's two detectors: outlier z-scores and the label rule run live.

:class:`OutlierHistory` keeps the recent finite values of one signal (loss or gradient
norm) and gives the z-score of a new value against them, as OLMo-core's skip-step rule
does (mean and std of the last 128 steps). Values of skipped steps are not added: an
outlier must not widen the band that judges the next one.

:class:`OnlineLabel` is ``collapse_guard.runfiles.label``'s rule applied as the run
goes: the same EWMA time constant, best level and margin (``LabelRule``), the same
settle period; only the confirmation differs. The label confirms a collapse when the
excursion outlasts its recovery window (3,000 steps), which a live run cannot wait
for; here an excursion that stays open ``confirm_steps`` steps is a collapse.

:func:`lr_jumped` reads the schedule the loop set (each step's ``param_groups[0]["lr"]``,
before the guard's multiplier): a step change of the LR is a jump, after which an outlier
streak is the optimizer's doing; a smooth rise (a warmup, a user's ramp) is not one.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

from collapse_guard.guard.policy import GuardPolicy
from collapse_guard.runfiles.label import LabelRule

__all__ = ["OnlineLabel", "OutlierHistory", "jump_starts", "lr_jumped"]


def lr_jumped(loop_lrs: Sequence[float], policy: GuardPolicy) -> bool:
    """At one of the last ``lr_jump_steps`` steps the loop's LR was over ``lr_jump_ratio``
    x its LR ``lr_jump_span`` steps before (``loop_lrs``: the loop's LR by step, newest
    last). With span 1 a ramp rising by less than the ratio each step is no jump, however
    far it goes; a step change is one for lr_jump_steps steps."""
    lrs, span = list(loop_lrs), policy.lr_jump_span
    first = max(span, len(lrs) - policy.lr_jump_steps)
    return any(lrs[i] > policy.lr_jump_ratio * lrs[i - span] for i in range(first, len(lrs)))


def jump_starts(loop_lrs: Sequence[float], lr: float, policy: GuardPolicy) -> bool:
    """The loop's LR ``lr`` of the step about to be taken starts a jump (:func:`lr_jumped`
    over ``loop_lrs`` and ``lr``), and none of the last ``lr_jump_steps`` steps did: the
    weights are still the schedule's, not yet the jump's (a 1-5 step re-warm starts once)."""
    span = policy.lr_jump_span
    if len(loop_lrs) < span or lr <= policy.lr_jump_ratio * loop_lrs[-span]:
        return False
    return not lr_jumped(loop_lrs, policy)


class OutlierHistory:
    """Recent finite values of one signal; ``z(x)`` of a new value against them."""

    def __init__(self, size: int, min_count: int) -> None:
        self.size, self.min_count = int(size), int(min_count)
        self.values: deque[float] = deque(maxlen=self.size)

    def band(self) -> tuple[float, float] | None:
        """(mean, std) of the history that z-scores judge by; None with too little of it."""
        n = len(self.values)
        if n < max(2, self.min_count):
            return None
        mean = sum(self.values) / n
        var = sum((v - mean) ** 2 for v in self.values) / (n - 1)
        # a floor on std: a flat history (a constant loss) must not make 1e-9 an outlier
        return mean, max(math.sqrt(var), 1e-3 * abs(mean), 1e-12)

    def z(self, value: float) -> float:
        """(value - mean) / std of the history; NaN with too little history or none finite."""
        band = self.band()
        if band is None or not math.isfinite(value):
            return math.nan
        mean, std = band
        return (value - mean) / std

    def add(self, value: float) -> OutlierHistory:
        if math.isfinite(value):
            self.values.append(float(value))
        return self

    def state_dict(self) -> dict[str, Any]:
        return {"values": list(self.values)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.values = deque((float(v) for v in state["values"]), maxlen=self.size)


class OnlineLabel:
    """The label rule on the live loss: is the run in an excursion, and for how long?"""

    def __init__(self, confirm_steps: int, rule: LabelRule | None = None) -> None:
        self.rule = rule or LabelRule()
        self.confirm_steps = int(confirm_steps)
        self.alpha = 1.0 - math.exp(-1.0 / self.rule.smooth_steps)  # the EWMA's weight
        self.reset()

    def reset(self) -> None:
        self.first_step: int | None = None
        self.smoothed = math.nan
        self.best = math.inf
        self.excursion_start: int | None = None

    def update(self, step: int, loss: float) -> OnlineLabel:
        """Feed one step's loss; a non-finite loss restarts the EWMA (as the label does)."""
        if self.first_step is None:
            self.first_step = step
        if not math.isfinite(loss):
            self.smoothed = math.nan
            return self
        self.smoothed = (
            loss
            if math.isnan(self.smoothed)
            else self.smoothed + self.alpha * (loss - self.smoothed)
        )
        if step < self.rule.settled_from(self.first_step):
            return self
        line = self.best + self.rule.margin(self.best) if math.isfinite(self.best) else math.inf
        if self.smoothed > line:
            if self.excursion_start is None:
                self.excursion_start = step
        else:
            self.excursion_start = None
            self.best = min(self.best, self.smoothed)
        return self

    def collapse_line(self, step: int) -> float:
        """The smoothed loss above which ``update(step, loss)`` confirms a collapse for a
        finite loss: ``inf`` when no loss can, ``-inf`` when any does (the device's copy
        of the rule needs this one number, device_gate.py)."""
        first = step if self.first_step is None else self.first_step
        start = self.excursion_start
        if step < self.rule.settled_from(first):  # update() leaves the excursion as it is
            return (
                -math.inf
                if start is not None and self.open_for(step) >= self.confirm_steps
                else math.inf
            )
        if step - (step if start is None else start) + 1 < self.confirm_steps:
            return math.inf  # an excursion opening (or open) now is too young to confirm
        return self.best + self.rule.margin(self.best) if math.isfinite(self.best) else math.inf

    def open_for(self, step: int) -> int:
        """Steps the current excursion has lasted at ``step`` (0 when none is open)."""
        return 0 if self.excursion_start is None else step - self.excursion_start + 1

    def collapsed(self, step: int) -> bool:
        return self.open_for(step) >= self.confirm_steps

    def state_dict(self) -> dict[str, Any]:
        return {
            "first_step": self.first_step,
            "smoothed": self.smoothed,
            "best": self.best,
            "excursion_start": self.excursion_start,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.first_step = state["first_step"]
        self.smoothed, self.best = float(state["smoothed"]), float(state["best"])
        self.excursion_start = state["excursion_start"]
