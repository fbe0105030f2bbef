"""<RESCUE>: forensics, the rollback to the ring's average, batch skips, the LR cap, layer caps.

:class:`Rescuer` returns the rescue's events and the trajectory training goes on from (the
checkpoint's, or a fresh one without a checkpoint); the run state learns the rescue
(its count, the cap, the skips). :func:`gave_up` is the error of a run that keeps
collapsing.

The cap gives the LR back (:func:`lift_cap`, every step a cap is set): after each
``lr_lift_steps`` healthy steps in a row it rises ``lr_lift``-fold, and it is gone once a
rise takes it over the loop's LR. At the first step of a warn or of a :func:`precursor`
(an open loss excursion, or a smoothed loss over its best by more than its noise and
``lr_lift_loss_rise`` nats: a rise that trains worse) a risen cap falls back to
``lr_fall`` x the LR in force, never below the rescue's own cap, and that LR is
remembered as the edge: later rises stop at
``lr_edge_share`` x the edge. A second rescue (and any later one) remembers the LR it
came at as the edge too; the first does not: the LR it came at may be sound (a bad
batch) and the cap lifts to the schedule, which tells. The cap, its floor and the edge
are run state: a rollback keeps them, a checkpoint carries them::

    rescue (cap c, edge e) --healthy x lr_lift_steps--> c x lr_lift ... <= lr_edge_share x e
        ^                                                  |           (> loop's LR: gone)
        |                       warn / excursion opens at LR l: edge l, cap lr_fall x l
        +-- a second rescue (new cap and edge) <-----------+
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import torch

from collapse_guard.guard import ddp
from collapse_guard.guard.check import lr_reaches, lr_unreached_text
from collapse_guard.guard.checkpoints import load_verified, save_atomic
from collapse_guard.guard.decision import DEVELOPED, GuardDecision
from collapse_guard.guard.forensics import GradientHistory
from collapse_guard.guard.policy import GuardPolicy
from collapse_guard.guard.reactive import OnlineLabel, OutlierHistory
from collapse_guard.guard.setup import GuardSetup
from collapse_guard.guard.state import RunState, Training, Trajectory
from collapse_guard.guard.warn_hold import WarnHold
from collapse_guard.predictor.core.levels import WARN

__all__ = [
    "GuardGaveUp",
    "Rescuer",
    "data_fault_text",
    "gave_up",
    "lift_cap",
    "precursor",
    "warn_fall",
]


class GuardGaveUp(RuntimeError):
    """The run kept collapsing after ``GuardPolicy.max_rescues`` rescues."""


def _forensics(
    folder: Path, step: int, training: Training, history: GradientHistory, blown: dict
) -> str:
    """The state and gradient histograms of the step rescued, under ``forensics/``."""
    folder = folder / "forensics" / f"step-{step:09d}"
    current = {"model": training.model.state_dict(), "optimizer": training.optimizer.state_dict()}
    save_atomic({"format": 1, "step": step, **current}, folder / "state.pt")
    history.save(folder, blown)
    return f"forensics:{folder.name}"


def _caps(
    decision: GuardDecision, run: RunState, lrs: tuple[float, float], blown: dict,
    policy: GuardPolicy,
) -> list[str]:  # fmt: skip
    """A lower LR cap, batches to skip and caps on the tensors that blew up; ``lrs``: the
    LR of the checkpoint rolled back to and the LR the collapse came at (from the second
    rescue on, the edge)."""
    p, (healthy_lr, broke_at) = policy, lrs
    # no LR of an update since a restart (NaN): the cap in force is the one to lower
    base = min(run.settled_cap(), healthy_lr) if math.isfinite(healthy_lr) else run.settled_cap()
    if math.isfinite(base):
        _set_cap(run, _cap_factor(decision.reason, p) * base, p)
    if run.rescues > 1 and math.isfinite(broke_at):
        run.lr_edge = broke_at
    run.pending_skips += p.skip_batches
    for name, median in blown.items():
        run.layer_bounds[name] = p.rescue_layer_clip * median
    events = [f"skip_batches:{p.skip_batches}", f"lr_ceiling:{run.lr_ceiling:.3g}"]
    if blown:
        events.append(f"layer_caps:{len(blown)}")
    return events


def _cap_factor(reason: str, policy: GuardPolicy) -> float:
    """The rescue cap's factor on the checkpoint's LR, by what the rescue was of."""
    if reason in DEVELOPED:
        return policy.developed_rescue_lr
    return policy.jump_rescue_lr if reason.startswith("lr_jump") else policy.rescue_lr


def _overflow_text(step: int, rescues: int) -> str:
    return (
        f"collapse-guard: the loss went non-finite again at step {step}, after {rescues} "
        "rescue(s) rolled back to finite weights and capped the LR: the forward itself "
        "likely overflows (fp16 activations over 65,504 grow with the weights, and a lower "
        "LR does not shrink them). Train in bf16, or keep activations in range (weight "
        "decay, QK-norm, a smaller init); a GradScaler guards the gradients, not the forward "
        "(said once)"
    )


def data_fault_text(step: int, policy: GuardPolicy) -> str:
    """The warning at the start of data-fault mode (decision.py)."""
    limit = policy.max_data_fault_skips
    stops = f"after {limit} skipped in a row the guard stops" if limit else "no bound on a streak"
    return (
        f"collapse-guard: step {step}: the first batch after a rollback is a loss outlier "
        "at weights that were healthy: the data went bad, not the model. Outlier batches "
        f"are skipped until {policy.data_clear_steps} clean ones in a row; {stops} "
        "(GuardPolicy.max_data_fault_skips). Check the data pipeline; if the data changed "
        "on purpose, call guard.data_changed() at the change (said once)"
    )


class Rescuer:
    """Rescues one model's training from its ring (module docstring)."""

    def __init__(self, setup: GuardSetup) -> None:
        self.setup = setup
        self.lr_reached = True  # till a rollback's LR did not (check.lr_reaches): every
        # rank checks alike, as an optimizer's state_dict may be a collective

    def __call__(
        self, decision: GuardDecision, norms: torch.Tensor, run: RunState, trajectory: Trajectory
    ) -> tuple[list[str], Trajectory]:
        """Rescue step ``run.step_index``: its events and the trajectory to go on from."""
        setup, s, policy = self.setup, run.step_index, self.setup.policy
        training, history = setup.training, setup.history
        events = []
        blown = history.outliers(norms, policy.layer_outlier_ratio, min_rows=1)
        if setup.rank == 0:
            try:
                events.append(_forensics(setup.folder, s, training, history, blown))
            except OSError as error:  # a full disk: the rescue matters more than its record
                where = setup.folder / "forensics"
                said = f"collapse-guard: could not write the forensics of step {s} under "
                said += f"{where} ({error}); the rescue goes on without them (said once)"
                setup.once.warn("forensics_unwritten", said, stacklevel=4)
                events.append("forensics:unwritten")
        broke_at = trajectory.lr_in_force  # the LR of the last update: the collapse's
        event, trajectory, healthy_lr = self._restore(decision, run, trajectory)
        events.append(event)
        run.after_rollback = True
        if decision.reason == "nonfinite_loss" and run.rescues:
            setup.once.warn("nonfinite_again", _overflow_text(s, run.rescues), stacklevel=4)
        run.rescues += 1
        run.skip_streak = run.quiet_steps = 0
        if decision.reason.startswith("average_worse"):  # a correction of the last rescue:
            return events, trajectory  # its LR cap and batch skips stand, none added
        events += _caps(decision, run, (healthy_lr, broke_at), blown, policy)
        if decision.restart:  # the cap warms up again as the loop's first rise did
            run.rewarm_start, run.rewarm_steps = s + 1, max(1, run.rise_ended or s)
        return events, trajectory

    def _restore(
        self, decision: GuardDecision, run: RunState, trajectory: Trajectory
    ) -> tuple[str, Trajectory, float]:
        """Load what the rescue rolls back to (the ring's checkpoints, or the origin on a
        restart); its event, the trajectory to go on from and the LR of the cap (the ring's
        newest checkpoint's; without one the LR of the last update)."""
        setup, training, s = self.setup, self.setup.training, run.step_index
        healthy_lr, run.averaged_rollback = trajectory.lr_in_force, False
        if not (decision.rollback_to or decision.restart):
            return "rollback:none", trajectory.restarted(setup.policy), healthy_lr
        if decision.rollback_to:
            state = setup.ring.rollback_state(decision.rollback_to)
            healthy_lr = float(state["guard"]["trajectory"].get("lr_in_force", math.nan))
        if decision.restart:  # the weights before the first update (amend.restarts)
            state = {**load_verified(setup.ring.origin()), "averaged": 1}
        regrouped = training.load(state, keep_lr=True)  # the loop's LR stays
        if regrouped:
            setup.once.warn("optimizer_regrouped", regrouped, stacklevel=5)
        if self.lr_reached and not lr_reaches(training.optimizer):
            self.lr_reached = False
            setup.once.warn("lr_unreached", lr_unreached_text(s, training.optimizer), stacklevel=5)
        trajectory.load_state_dict(state["guard"]["trajectory"])
        run.averaged_rollback = state["averaged"] > 1
        setup.probe.reset()  # the rollback is not an update: forget the previous sketch
        ddp.barrier()  # every rank has read the files before rank 0 may replace them
        if decision.rewind and setup.rank == 0:
            setup.ring.rewind()
        if decision.restart and setup.rank == 0:
            setup.ring.restart()
        return f"rollback:avg{state['averaged']}@{state['step']}", trajectory, healthy_lr

    def fall(
        self, decision: GuardDecision, run: RunState, trajectory: Trajectory, hold: WarnHold
    ) -> list[str]:
        """The forecast's fall after step ``run.step_index`` (:func:`warn_fall`)."""
        policy = self.setup.policy
        if not policy.warn_fall or not hold.on or decision.rescue:
            return []  # nothing to fall from (the precursor's pass is not free)
        return warn_fall(run, self._precursor(run, trajectory), hold.ceiling, policy)

    def lift(self, decision: GuardDecision, run: RunState, trajectory: Trajectory) -> list[str]:
        """The cap's rise or fall after step ``run.step_index`` (:func:`lift_cap`)."""
        policy, optimizer = self.setup.policy, self.setup.training.optimizer
        if not math.isfinite(run.lr_ceiling) or not policy.lr_lift_steps:
            return []  # no cap to move (the precursor's pass over the losses is not free)
        seen = self._precursor(run, trajectory)
        loop_lr = run.loop_lrs[-1] if run.loop_lrs else optimizer.param_groups[0]["lr"]
        return lift_cap(decision, run, seen, (loop_lr, trajectory.lr_in_force), policy)

    def _precursor(self, run: RunState, trajectory: Trajectory) -> bool:
        """:func:`precursor` at step ``run.step_index``, rank 0's: its online label is the
        one that decides, so every rank keeps one cap."""
        return ddp.share(
            precursor(trajectory.online, trajectory.loss_history, run.step_index, self.setup.policy)
            if self.setup.rank == 0
            else None
        )


def precursor(online: OnlineLabel, history: OutlierHistory, step: int, policy: GuardPolicy) -> bool:
    """The loss says trouble at ``step``: the online label's excursion is open (its
    margin), or the smoothed loss is over its best by ``lr_lift_loss_rise`` nats and by
    ``lr_lift_loss_z`` x the smoothing's noise (a rise of the cap whose LR trains worse).
    The noise: a batch's, from the recent losses' steps (``history``: std of consecutive
    differences / sqrt 2, blind to the trend), x sqrt(a / (2 - a)), the EWMA's share of
    white noise at weight a; the best, a minimum of that noisy curve, sits a few of those
    below its mean, hence a z as high as the outlier rule's."""
    if online.open_for(step) > 0:
        return True
    losses = list(history.values)
    if len(losses) < history.min_count:
        return False
    steps = [b - a for a, b in itertools.pairwise(losses)]
    batch = math.sqrt(sum(d * d for d in steps) / (2 * len(steps)))
    margin = max(
        policy.lr_lift_loss_rise,
        policy.lr_lift_loss_z * batch * math.sqrt(online.alpha / (2 - online.alpha)),
    )
    return online.smoothed - online.best > margin  # NaN or -inf before there is a best


def warn_fall(run: RunState, loss_warns: bool, held_at: float, policy: GuardPolicy) -> list[str]:
    """While the warn's hold is on (at ``held_at``), a :func:`precursor` (``loss_warns``)
    caps the LR at ``policy.warn_fall`` x ``held_at``: the hold stopped the rise, the loss
    rises still, so the run cannot absorb the LR it holds. A rescue's cap, kept for good,
    without the rollback: nothing is undone. Returns ``lr_ceiling:<lr>`` when the cap fell."""
    cap = policy.warn_fall * held_at
    if not loss_warns or cap >= run.lr_cap():
        return []
    _set_cap(run, cap, policy)
    return [f"lr_ceiling:{cap:.3g}"]


def _set_cap(run: RunState, cap: float, policy: GuardPolicy) -> None:
    """A new cap for good, its own floor (a lift never goes under it); the lift starts over;
    with ``cap_follows_schedule`` it falls with the loop's LR from the one it was set at."""
    if math.isfinite(run.lr_edge):  # an LR at the old anchor: the LR it is now, at the new
        run.lr_edge *= run.cap_ratio()
    run.lr_ceiling = run.lr_floor = cap
    loop_lr = run.loop_lrs[-1] if run.loop_lrs else math.nan
    follows = policy.cap_follows_schedule and 0 < loop_lr < math.inf  # an LR of 0 (a warmup's
    # first step) gives no ratio to follow: that cap stands still
    run.lr_anchor = loop_lr if follows else math.inf
    run.lift_quiet, run.lift_troubled = 0, False


def lift_cap(
    decision: GuardDecision, run: RunState, loss_warns: bool, lrs: tuple[float, float],
    policy: GuardPolicy,
) -> list[str]:  # fmt: skip
    """Raise or lower the rescues' cap after a step (module docstring); ``loss_warns``:
    the loss shows a :func:`precursor`; ``lrs``: the loop's LR of the step and the LR in
    force. Returns its events (``lr_lift:<cap>``, ``lr_ceiling:off``, ``lr_fall:..``)."""
    if not math.isfinite(run.lr_ceiling) or decision.rescue or not policy.lr_lift_steps:
        return []
    if policy.acting_level(decision.level) >= WARN or loss_warns:  # a warn the guard acts on
        fall = not run.lift_troubled and run.lr_ceiling > run.lr_floor
        run.lift_troubled, run.lift_quiet = True, 0
        return _fall(run, lrs[1], policy) if fall else []
    run.lift_troubled = False
    accepted = any(e.startswith("accept:") for e in decision.events)
    if not decision.apply_update or accepted:  # a reactive trigger: the stretch starts over
        run.lift_quiet = 0
        return []
    run.lift_quiet += 1
    if run.lift_quiet < policy.lr_lift_steps:
        return []
    run.lift_quiet = 0
    return _rise(run, lrs[0], policy)


def _rise(run: RunState, loop_lr: float, policy: GuardPolicy) -> list[str]:
    cap = min(run.lr_ceiling * policy.lr_lift, policy.lr_edge_share * run.lr_edge)
    if max(cap, run.lr_ceiling) * run.cap_ratio() > loop_lr:  # under the cap: its LR again
        run.lr_ceiling = run.lr_floor = math.inf
        return ["lr_ceiling:off"]
    if cap <= run.lr_ceiling:  # at the edge's bound already
        return []
    run.lr_ceiling = cap
    return [f"lr_lift:{cap:.3g}"]


def _fall(run: RunState, lr_in_force: float, policy: GuardPolicy) -> list[str]:
    ratio = run.cap_ratio()  # the cap's LRs are the anchor's: the LR in force over ratio
    at_anchor = lr_in_force / ratio if ratio > 0 else math.inf
    edge = min(run.lr_ceiling, at_anchor) if math.isfinite(at_anchor) else run.lr_ceiling
    run.lr_edge = edge
    run.lr_ceiling = max(run.lr_floor, policy.lr_fall * edge)
    return [f"lr_fall:{run.lr_ceiling:.3g}@{edge:.3g}"]


def gave_up(
    decision: GuardDecision, rescues: int, policy: GuardPolicy, folder: Path
) -> GuardGaveUp:
    """The error that stops a run collapsing again with its rescues spent, or whose data
    stayed bad (``data_fault_skips``: every batch skipped would train nothing)."""
    if decision.reason.startswith("data_fault_skips"):
        return GuardGaveUp(
            f"step {decision.step}: the last {policy.max_data_fault_skips} batches were all "
            "outliers at weights a rollback restored: the data went bad, not the model, and "
            "stayed bad (GuardPolicy.max_data_fault_skips); stopping "
            "instead of skipping every batch. Check the data pipeline (the shards or loader "
            "since the first data_fault event in the run file), then guard.resume() from "
            "the ring's newest checkpoint; max_data_fault_skips=0 skips without limit. A "
            "change of the data made on purpose: call guard.data_changed() at the change"
        )
    return GuardGaveUp(
        f"step {decision.step}: the run collapsed again ({decision.reason}) after "
        f"{rescues} rescues (GuardPolicy.max_rescues={policy.max_rescues}); "
        f"stopping instead of looping. Forensics of each rescue are in {folder}/"
        "forensics; lower the LR, check the data (a loss that rises again after every "
        "rollback can be the data going bad), or raise max_rescues to keep trying"
    )
