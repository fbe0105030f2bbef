"""<RESCUE>: forensics, the rollback to the ring's average, batch skips, the LR cap, layer caps.

:class:`Rescuer` returns the rescue's events and the trajectory training goes on from (the
checkpoint's, or a fresh one without a checkpoint); the run state learns the rescue
(its count, the cap, the skips). :func:`gave_up` is the error of a run that keeps
collapsing.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from collapse_guard.guard import ddp
from collapse_guard.guard.checkpoints import save_atomic
from collapse_guard.guard.decision import GuardDecision
from collapse_guard.guard.forensics import GradientHistory
from collapse_guard.guard.policy import GuardPolicy
from collapse_guard.guard.setup import GuardSetup
from collapse_guard.guard.state import RunState, Training, Trajectory

__all__ = ["GuardGaveUp", "Rescuer", "gave_up"]


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
    decision: GuardDecision, run: RunState, healthy_lr: float, blown: dict, policy: GuardPolicy
) -> list[str]:
    """A lower LR cap, batches to skip and caps on the tensors that blew up."""
    p = policy
    if math.isfinite(healthy_lr):
        developed = decision.reason == "online_collapse"
        factor = p.developed_rescue_lr if developed else p.rescue_lr
        run.lr_ceiling = factor * min(run.lr_ceiling, healthy_lr)
    run.pending_skips += p.skip_batches
    for name, median in blown.items():
        run.layer_bounds[name] = p.rescue_layer_clip * median
    events = [f"skip_batches:{p.skip_batches}", f"lr_ceiling:{run.lr_ceiling:.3g}"]
    if blown:
        events.append(f"layer_caps:{len(blown)}")
    return events


class Rescuer:
    """Rescues one model's training from its ring (module docstring)."""

    def __init__(self, setup: GuardSetup) -> None:
        self.setup = setup

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
        healthy_lr = trajectory.lr_in_force  # without a checkpoint: the LR of the last update
        run.averaged_rollback = False
        if decision.rollback_to:
            state = setup.ring.rollback_state(decision.rollback_to)
            training.load(state, keep_lr=True)  # the loop's LR stays
            trajectory.load_state_dict(state["guard"]["trajectory"])
            healthy_lr = trajectory.lr_in_force  # the newest checkpoint's
            run.averaged_rollback = state["averaged"] > 1
            setup.probe.reset()  # the rollback is not an update: forget the previous sketch
            events.append(f"rollback:avg{state['averaged']}@{state['step']}")
            ddp.barrier()  # every rank has read the files before rank 0 may replace them
        else:
            trajectory = trajectory.restarted(policy)
            events.append("rollback:none")
        run.after_rollback = True
        run.rescues += 1
        run.skip_streak = run.quiet_steps = 0
        if decision.reason.startswith("average_worse"):  # a correction of the last rescue:
            return events, trajectory  # its LR cap and batch skips stand, none added
        return events + _caps(decision, run, healthy_lr, blown, policy), trajectory


def gave_up(
    decision: GuardDecision, rescues: int, policy: GuardPolicy, folder: Path
) -> GuardGaveUp:
    """The error that stops a run collapsing again with its rescues spent."""
    return GuardGaveUp(
        f"step {decision.step}: the run collapsed again ({decision.reason}) after "
        f"{rescues} rescues (GuardPolicy.max_rescues={policy.max_rescues}); "
        f"stopping instead of looping. Forensics of each rescue are in {folder}/"
        "forensics; lower the LR, check the data (a loss that rises again after every "
        "rollback can be the data going bad), or raise max_rescues to keep trying"
    )
