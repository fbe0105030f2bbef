"""The forecast's hold at ``warn`` (``GuardPolicy.warn_action="hold"``, the default): stop an
LR rise.

The warn level says the run is drifting towards a collapse; the real runs collapse past
the LR they were stable at (the sampler's recipes: ramps and re-warms 1.5-4x past the
stable edge). Instead of cutting the LR (``warn_lr``), the hold keeps the LR in force at
the warn's first step as a ceiling while the risk stays at warn or above: the loop's
schedule may go on rising, the LR in force does not. Nothing is rolled back. When the
risk falls below warn (``hold_release``; ``"watch"`` waits for a risk under watch), the
ceiling rises by doubling every ``lr_restore_steps`` (the level multiplier's own pace: a
level left is not trusted at once) until it passes the LR the step would run at, and the
hold is gone::

    below warn --warn at LR l--> held at l --(risk < warn)--> l x 2^(t / lr_restore_steps)
        ^                          ^   | (warn again: the rise stops where it is)  |
        |                          +---+                                           |
        +------------------- lr_hold:off (over the step's LR) <--------------------+

The ceiling lives in the host's applier (apply.py) and a rollback keeps it, as it keeps
the rescues' cap; a checkpoint carries it (``Guard.state_dict()``'s ``run["lr_hold"]``), so
a resumed run is held where it stopped; steps do not defer while it is on (deferred.py's
device path knows only the rescues' cap).

While the hold stops a rise (the loop's LR over the held one), the loss must go on falling:
:class:`HoldStall` asks ``warn_stall_gain`` nats of the smoothed loss per ``warn_stall_steps``
held steps, and a stretch without them is a rescue (``rescue:warn_stall``, amend.Decider,
before any other rescue, as a rise under the hold is): a run that trains no further at the
LR it was held at sits at its edge (decision 29 in docs/decisions.md). A hold that stops
nothing (the schedule fell under it) leaves a flat loss alone: the LR in force is the loop's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from collapse_guard.guard.policy import GuardPolicy
from collapse_guard.predictor.core.levels import Level

__all__ = ["HoldStall", "WarnHold"]


@dataclass
class WarnHold:
    """The hold's ceiling on the LR in force (inf: no hold) and the holds begun."""

    ceiling: float = math.inf
    holds: int = 0

    @property
    def on(self) -> bool:
        return math.isfinite(self.ceiling)

    def update(self, level: Level, lr: float, policy: GuardPolicy) -> list[str]:
        """Move the ceiling for a step at ``level`` whose LR in force would be ``lr``
        without the hold (the loop's x the level's multiplier, under the rescues' cap);
        returns its events (``lr_hold:<lr>``, ``lr_hold:off``)."""
        if policy.holds_lr(level):
            if self.on:  # held already (or released part of the way): the rise stops here
                return []
            self.ceiling, self.holds = lr, self.holds + 1
            return [f"lr_hold:{lr:.3g}"]
        if not self.on or not policy.releases_hold(level):
            return []
        steps = policy.lr_restore_steps
        self.ceiling *= 2.0 ** (1.0 / steps) if steps else math.inf
        if self.ceiling < lr:
            return []
        self.ceiling = math.inf
        return ["lr_hold:off"]

    def state_dict(self) -> dict[str, float | int]:
        """Plain values (a checkpoint loads with ``weights_only=True``)."""
        return {"ceiling": float(self.ceiling), "holds": int(self.holds)}

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        self.ceiling, self.holds = float(state["ceiling"]), int(state["holds"])

    def summary(self) -> dict[str, float | int]:
        """The guard summary's part: holds begun, and the ceiling now (inf: none)."""
        return {"lr_holds": self.holds, "lr_hold": self.ceiling}


@dataclass
class HoldStall:
    """Whether the smoothed loss stopped falling under the warn's hold
    (``GuardPolicy.warn_stall_steps``): the hold keeps the LR at its warn, and a run that
    trains no further there sits at its edge. Each stretch of ``warn_stall_steps`` held
    steps must end ``warn_stall_gain`` nats under the smoothed loss it began at; a stretch
    that does not is a stall, and the next begins there. Process-only (a resumed run starts
    its stretch over)."""

    since: int = -1  # the step the stretch began at (-1: none, the hold is off)
    loss: float = math.nan  # the smoothed loss then

    def update(self, step: int, smoothed: float, policy: GuardPolicy) -> bool:
        """Step ``step`` (``smoothed``: the label's EWMA of the loss under the hold; NaN:
        no hold, or no loss to judge): whether a stretch ended without its gain."""
        if not math.isfinite(smoothed) or not policy.warn_stall_steps:
            self.since = -1
            return False
        if self.since < 0:
            self.since, self.loss = step, smoothed
            return False
        if step - self.since < policy.warn_stall_steps:
            return False
        stalled = not smoothed < self.loss - policy.warn_stall_gain
        self.since, self.loss = step, smoothed
        return stalled
