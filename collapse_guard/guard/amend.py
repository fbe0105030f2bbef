"""<DECIDE>'s two halves around the pure ``decide``: the facts gathered from the guard's
state, and the decision amended by what ``decide`` cannot know (a forced action, a
parameter that is not finite, the checkpoints a rescue rolls back to).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from collapse_guard.guard.checkpoints import CheckpointRing, read_sidecar, verify
from collapse_guard.guard.decision import (
    COLLAPSED,
    DEVELOPED,
    GuardDecision,
    StepFacts,
    decide,
    is_healthy,
)
from collapse_guard.guard.measure import amp_overflow, lr_jumped
from collapse_guard.guard.policy import GuardPolicy
from collapse_guard.guard.rescue import precursor
from collapse_guard.guard.setup import GuardSetup
from collapse_guard.guard.state import RunState, Trajectory
from collapse_guard.guard.warn_hold import HoldStall, WarnHold
from collapse_guard.predictor.core.levels import WARN

__all__ = [
    "DATA_CHANGED",
    "FORCEABLE",
    "Decider",
    "checkable",
    "forced",
    "gather_facts",
    "healthy_before_jump",
    "nonfinite_param",
    "nonfinite_text",
    "restarts",
    "with_rollback",
    "worse_by",
]

FORCEABLE = ("skip", "rescue", "checkpoint")
DATA_CHANGED = "data_changed"  # the event of the step ``Guard.data_changed`` comes before


def gather_facts(
    run: RunState,
    trajectory: Trajectory,
    loss: float,
    grad_norm: float,
    *,
    outliers: tuple[str, ...] = (),
    stale: str = "",
    amp_overflow: bool = False,
    lr_jump: bool = False,
    held: bool = False,
) -> StepFacts:
    """Step ``run.step_index``'s facts, before the update."""
    s = run.step_index
    return StepFacts(
        step=s,
        loss=loss,
        grad_norm=grad_norm,
        grad_finite=math.isfinite(grad_norm),
        loss_z=trajectory.loss_history.z(loss),
        grad_z=trajectory.grad_history.z(grad_norm),
        level=run.level,
        probability=run.probability,
        lr_multiplier=run.lr_multiplier,
        skip_streak=run.skip_streak,
        collapse_online=trajectory.online.collapsed(s),
        rescues=run.rescues,
        layer_outliers=outliers,
        since_checkpoint=s - run.last_checkpoint,
        quiet_steps=run.quiet_steps,
        amp_overflow=amp_overflow,
        lr_jump=lr_jump,
        after_rollback=run.after_rollback,
        averaged_rollback=run.averaged_rollback,
        data_fault=run.data_fault,
        clean_steps=run.clean_steps,
        stale_gradients=stale,
        held=held,
    )


def forced(decision: GuardDecision, action: str | None) -> GuardDecision:
    """``decision`` with ``guard.force_next``'s action (None: as it is)."""
    if action == "skip":
        return replace(
            decision,
            apply_update=False,
            reason="forced",
            events=(*decision.events, "skip:forced"),
        )
    if action == "rescue":
        return replace(
            decision,
            apply_update=False,
            rescue=True,
            reason="forced",
            events=(*decision.events, "rescue:forced"),
        )
    if action == "checkpoint":
        return replace(decision, checkpoint=True, events=(*decision.events, "checkpoint"))
    if action == DATA_CHANGED:  # the new data's first checkpoint: the ring starts there
        events = (*decision.events, DATA_CHANGED, "checkpoint")
        return replace(decision, checkpoint=True, events=events)
    return decision


def nonfinite_param(params: Sequence[torch.Tensor]) -> int | None:
    """The index of the first parameter holding NaN or inf (None: all finite). One foreach
    pass and one sync: at checkpoint steps only."""
    norms = torch._foreach_norm([p.detach() for p in params])
    device = norms[0].device
    finite = torch.isfinite(torch.stack([n.float().to(device) for n in norms])).cpu()
    return None if bool(finite.all()) else int((~finite).nonzero()[0])


def healthy_before_jump(run: RunState, policy: GuardPolicy, params: Sequence[torch.Tensor]) -> bool:
    """The weights before an LR jump make a healthy checkpoint: the last steps were quiet
    and trained (not at weights a rollback restored, not in data-fault mode), every
    parameter finite: what a due checkpoint asks (``decide``, :func:`checkable`)."""
    fit = is_healthy(run.quiet_steps, run.level, policy)
    if not fit or run.after_rollback or run.data_fault:
        return False
    return nonfinite_param(params) is None


def checkable(decision: GuardDecision, name: str | None) -> GuardDecision:
    """``decision`` without its checkpoint where parameter ``name`` is not finite: a NaN in
    a tensor the forward never reads (an unused embedding row) harms no loss, so no other
    rule sees it, but it must not go into a "healthy" checkpoint."""
    if name is None:
        return decision
    events = tuple(
        f"checkpoint_refused:nonfinite_param={name}" if e == "checkpoint" else e
        for e in decision.events
    )
    return replace(decision, checkpoint=False, events=events)


def with_rollback(
    decision: GuardDecision,
    ring: CheckpointRing,
    policy: GuardPolicy,
    jump_checkpoint: int | None = None,
) -> GuardDecision:
    """A rescue names the checkpoints it averages (every DDP rank reads the same files):
    those that share a basin with the newest; the newest alone after an average was worse;
    an LR jump's, the checkpoint written before the jump alone (``jump_checkpoint``, its
    step; the ring's as before where it is gone); the ring's best alone when a developed
    collapse's ring trained worse (:func:`worse_by`)."""
    p = policy
    paths = tuple(str(x) for x in ring.basin(p.average_span, p.average_loss_gap))
    if decision.reason.startswith("average_worse"):
        paths = paths[-1:]  # the newest checkpoint alone: weights measured healthy
    before = ring.at(jump_checkpoint)
    if decision.reason.startswith("lr_jump") and before is not None:
        paths = (str(before),)  # the weights before the jump broke them: nothing else to undo
    if decision.reason in DEVELOPED and p.rewind_loss_gap:
        gap = worse_by(ring)
        if gap > p.rewind_loss_gap and _sound(ring.best()):
            events = (*decision.events, f"rewind:loss_gap={gap:.3g}")
            return replace(decision, rollback_to=(str(ring.best()),), rewind=True, events=events)
    return replace(decision, rollback_to=paths)


def restarts(decision: GuardDecision, run: RunState, policy: GuardPolicy, origin: Path) -> bool:
    """A rescue that restarts from ``origin`` (the state before the guard's first update):
    the run's first, of a collapse (decision.COLLAPSED), within ``restart_window`` steps of
    the end of the loop's first LR rise (or during it). Every ring checkpoint was then
    trained at the rising LRs the run could not absorb; a lower LR from them does not undo
    it (docs/decisions.md 30). A collapse's rescue with no ring checkpoint to roll back to
    (before the first, or after a restart emptied the ring) restarts too."""
    window, ended = policy.restart_window, run.rise_ended
    if not window or decision.reason.split("=")[0] not in COLLAPSED:
        return False
    in_warmup = not run.rescues and (ended is None or decision.step - ended <= window)
    return (in_warmup or not decision.rollback_to) and origin.exists() and _sound(origin, "restart")


def _sound(path: Path, action: str = "rewind") -> bool:
    """The ``action``'s checkpoint passes its sidecar's check; if not, the rescue rolls
    back to the ring as before, and says why (it must not land on a damaged file)."""
    try:
        why = verify(path)
    except OSError as error:
        why = error.strerror or type(error).__name__
    if why:
        warnings.warn(
            f"collapse-guard: no {action} to {path.name} ({why}); rolling back to the ring's "
            "checkpoints instead",
            RuntimeWarning,
            stacklevel=5,
        )
    return not why


def worse_by(ring: CheckpointRing) -> float:
    """Nats by which the ring's newest checkpoint's recorded loss stands over its best's
    (0 where either is unknown or the newest is the best)."""
    paths, best = ring.paths(), ring.best()
    if not paths or best is None or best == paths[-1]:
        return 0.0
    newest = (read_sidecar(paths[-1]) or {}).get("loss")  # the ring keeps only the best's
    return newest - ring.best_loss() if isinstance(newest, float) else 0.0


def nonfinite_text(step: int, name: str) -> str:
    """The warning of a checkpoint refused for parameter ``name`` (given once a run)."""
    return (
        f"collapse-guard: step {step}: parameter {name!r} holds NaN or inf; no healthy "
        "checkpoint is written while it does (event checkpoint_refused:nonfinite_param). "
        "A tensor the forward never reads gets no gradient, so nothing in training repairs "
        "it: find what wrote it. This warning is given once."
    )


class Decider:
    """<DECIDE> for one guard: the facts of a step, ``decide``, and the amendments; it
    holds the action ``force_next`` asked for until the next step it decides. The online
    label's step is taken here (it reads this very loss); nothing else changes."""

    def __init__(self, setup: GuardSetup, hold: WarnHold) -> None:
        self.setup, self.hold = setup, hold  # the applier's hold: read, never moved here
        self.forced: str | None = None  # the next step's action (``force_next``)
        self.stall = HoldStall()

    def force(self, action: str) -> None:
        if action not in FORCEABLE:
            raise ValueError(f"action must be one of {FORCEABLE}, got {action!r}")
        self.forced = action

    def data_changed(self) -> None:
        """``Guard.data_changed``: the next step is checkpointed and says so; the stall
        rule's best loss was the old data's."""
        self.forced, self.stall = DATA_CHANGED, HoldStall()

    def __call__(
        self,
        run: RunState,
        trajectory: Trajectory,
        loss: float,
        grad_norm: float,
        norms: torch.Tensor,
        stale: str,
    ) -> GuardDecision:
        """Step ``run.step_index``'s decision (a forced action taken)."""
        setup, policy = self.setup, self.setup.policy
        if not run.data_fault and not stale:  # in data-fault mode only applied steps count
            trajectory.online.update(run.step_index, loss)
        ratio = policy.layer_outlier_ratio
        outliers = setup.history.outliers(norms, ratio) if run.level >= WARN else {}
        overflow = amp_overflow(setup.training.scaler, setup.training.optimizer)
        facts = gather_facts(
            run, trajectory, loss, grad_norm, outliers=tuple(outliers), stale=stale,
            amp_overflow=overflow, lr_jump=lr_jumped(run.loop_lrs, policy), held=self.hold.on,
        )  # fmt: skip
        warned = policy.warn_rescue and self.hold.on and not run.rescues  # the forecast's
        # rescue comes first or not at all: after a rollback the restored loss record still
        # shows the rise, and the online label judges what comes next
        binds = bool(run.loop_lrs) and run.loop_lrs[-1] > self.hold.ceiling  # a rise stopped
        smoothed = trajectory.online.smoothed if warned and binds else math.nan  # NaN: none
        stall = self.stall.update(run.step_index, smoothed, policy)
        if warned:
            rise = precursor(trajectory.online, trajectory.loss_history, run.step_index, policy)
            facts = replace(facts, warned_rise=rise, warned_stall=stall)
        action, self.forced = self.forced, None
        decision = forced(decide(facts, policy), action)
        if decision.checkpoint and not decision.rescue:
            i = nonfinite_param(setup.params)
            name = setup.param_names[i] if i is not None else None
            if name is not None:
                setup.once.warn("nonfinite_param", nonfinite_text(decision.step, name), 3)
            decision = checkable(decision, name)
        if decision.rescue:
            decision = with_rollback(decision, setup.ring, policy, run.jump_checkpoint)
            if restarts(decision, run, policy, setup.ring.origin()):
                kept = (e for e in decision.events if not e.startswith("rewind:"))
                events = (*kept, "restart:origin")
                decision = replace(decision, restart=True, rewind=False, events=events)
        return decision
