"""How a step's facts reach the host: at once (:class:`ImmediateSync`) or a step later
(:class:`DeferredSync`, ``Guard(sync="deferred")``).

A deferred step is a healthy-looking one whose update the device gates by the reactive
rules (``device_gate.py``, with the z and outlier rules of ``decision.py``: one
definition for both paths); its facts travel to the host as a :class:`PendingStep` and
are read at the next step (:meth:`DeferredSync.take`), where the guard decides them as a
step read at once would, and :meth:`DeferredSync.check` makes sure the device's gate
reached that same verdict. Which steps may defer: :meth:`DeferredSync.may_defer`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from collapse_guard.guard import ddp
from collapse_guard.guard.decision import (
    GuardDecision,
    StepFacts,
    accepts_outliers,
    decide,
    outlier_z,
)
from collapse_guard.guard.device_gate import (
    GateBands,
    HostCopy,
    can_skip_on_device,
    gated_step,
    skip_flag,
)
from collapse_guard.guard.lr import lr_for_step, restore_lr
from collapse_guard.guard.measure import clip_coefficient
from collapse_guard.guard.policy import GuardPolicy
from collapse_guard.guard.qk_clip import head_maxima
from collapse_guard.guard.state import RunState, Trajectory
from collapse_guard.predictor.core.levels import WATCH
from collapse_guard.signals import SIGNAL_NAMES

__all__ = [
    "DeferredMismatch",
    "DeferredSync",
    "ImmediateSync",
    "PendingStep",
    "SettledStep",
    "deferred_sync",
    "make_sync",
]

_GATE, _RECORD, _QK = "gate", "record", "qk"  # the parts of a pending step's copy


class DeferredMismatch(RuntimeError):
    """The device's gate and the host's decision of a deferred step disagree (a bug)."""


def deferred_sync(sync: str, model: nn.Module, optimizer: Any) -> bool:
    """Whether the guard reads a step's facts a step later (``Guard``'s ``sync``)."""
    modes = ("auto", "step", "deferred")
    if sync not in modes:
        raise ValueError(f"sync must be one of {modes}, got {sync!r}")
    on_device = can_skip_on_device(optimizer)
    if sync == "deferred" and not on_device:
        raise ValueError(
            f"sync='deferred' needs an optimizer that skips an update on the device (takes "
            f"a found_inf tensor); {type(optimizer).__name__} here does not. Build it with "
            "fused=True (torch's Adam, AdamW, SGD), or use sync='step'"
        )
    if sync == "auto":
        first = next(iter(model.parameters()), None) if isinstance(model, nn.Module) else None
        return on_device and first is not None and first.device.type == "cuda"
    return sync == "deferred"


@dataclass(frozen=True)
class SettledStep:
    """A deferred step's facts, read by the host."""

    norms: torch.Tensor  # per-tensor gradient norms, on the device
    loss: float
    grad_norm: float
    skipped: bool  # the device's gate did not apply the update
    record: dict[str, float]  # the probe's record of the step
    maxima: dict[str, np.ndarray]  # head maxima of its probe pass, by module (QK-clip)
    loop_lr: float  # group 0's LR as the loop set it
    applied_lr: float  # the LR in force had the update been applied


@dataclass(frozen=True)
class PendingStep:
    """A deferred step on its way to the host: one copy of its values, by part."""

    norms: torch.Tensor
    copy: HostCopy  # keys (part, name): part one of "gate", "record", "qk"
    loop_lr: float
    applied_lr: float

    def read(self) -> SettledStep:
        parts: dict[str, dict[str, Any]] = {_GATE: {}, _RECORD: {}, _QK: {}}
        for (part, name), value in self.copy.read().items():
            parts[part][name] = value
        gate = parts[_GATE]
        record = dict.fromkeys(SIGNAL_NAMES, math.nan)
        record.update(parts[_RECORD])
        return SettledStep(
            self.norms,
            gate["loss"],
            gate["grad_norm"],
            gate["skip"] > 0,
            record,
            parts[_QK],
            self.loop_lr,
            self.applied_lr,
        )


class ImmediateSync:
    """``sync="step"``: every step reads its loss and gradient norm before the update."""

    def may_defer(self, run: RunState, *, stale: str, forced: bool, amp: bool) -> bool:
        return False

    def take(self) -> SettledStep | None:
        return None

    def take_discard(self) -> str:
        return ""

    def forget(self) -> None:
        pass


class DeferredSync:
    """``sync="deferred"``: a healthy-looking step's update gated on the device, its facts
    read at the next step (module docstring)."""

    def __init__(
        self,
        policy: GuardPolicy,
        optimizer: Any,
        params: Sequence[torch.Tensor],
        probe: Any,
        qk: bool,
    ) -> None:
        self.policy, self.optimizer, self.params, self.probe = policy, optimizer, params, probe
        self.qk = qk  # QK-clip is on: a step's head maxima travel with its facts
        self._pending: PendingStep | None = None
        self._discard_next = False  # the rescue of a deferred step: the backward made
        # since ran at the weights it replaced

    def may_defer(self, run: RunState, *, stale: str, forced: bool, amp: bool) -> bool:
        """Whether this step may defer. Read now (one sync): DDP (rank 0's decision is
        broadcast); AMP (the scaler's own skip); a QK-clip plan to apply (a head over tau
        at the last probe pass, whose maxima a deferred step copies with its facts); a
        stale step; a forced action; warn or critical (outlier layers are clipped by
        their norms); the first step after a rollback and data-fault mode (their rules
        read this step's loss); and layer caps from a rescue."""
        if stale or forced or run.qk_pending:
            return False
        if run.level > WATCH or run.after_rollback or run.data_fault:
            return False
        return not (amp or run.layer_bounds or ddp.is_distributed())

    def healthy(self, facts: StepFacts) -> GuardDecision | None:
        """The decision of a step whose loss and gradients are healthy (``facts`` of a
        loss 0 and a gradient norm 1), unless it checkpoints (the parameters are read for
        finiteness) or would not update: then this step reads its facts now."""
        facts = replace(facts, loss_z=math.nan, grad_z=math.nan, collapse_online=False)
        decision = decide(facts, self.policy)
        return decision if decision.apply_update and not decision.checkpoint else None

    def bands(self, run: RunState, trajectory: Trajectory, lr_jump: bool) -> GateBands:
        """The host's thresholds for the device's gate: ``decide``'s own rules."""
        z = outlier_z(run.level, self.policy)
        if accepts_outliers(run.skip_streak, run.data_fault, self.policy) and not lr_jump:
            z = math.inf  # an outlier is applied now (decision.py); after an LR jump it rescues
        online = trajectory.online
        return GateBands(
            trajectory.loss_history.band(),
            trajectory.grad_history.band(),
            z,
            online.smoothed,
            online.alpha,
            online.collapse_line(run.step_index),
        )

    def launch(
        self,
        decision: GuardDecision,
        loss: torch.Tensor,
        total: torch.Tensor,
        norms: torch.Tensor,
        run: RunState,
        trajectory: Trajectory,
        lr_jump: bool,
    ) -> None:
        """The update, gated on the device; its facts (the probe's record, with QK-clip the
        head maxima of its probe pass) start for the host with no sync."""
        skip = skip_flag(loss, total, self.bands(run, trajectory, lr_jump))
        optimizer, probe = self.optimizer, self.probe
        if decision.clip_to > 0:  # the host's global clipping, on the device, same float ops
            coef = clip_coefficient(decision.clip_to, total)  # 1 exactly when under the clip
            torch._foreach_mul_([p.grad for p in self.params if p.grad is not None], coef)
        saved, applied_lr = lr_for_step(optimizer, decision.lr_multiplier, run.lr_cap())
        gated_step(optimizer, skip)
        restore_lr(optimizer, saved)  # no warm-up check: it counts applied steps (take)
        values: dict[tuple[str, str], Any] = {
            (_GATE, "loss"): loss,
            (_GATE, "grad_norm"): total,
            (_GATE, "skip"): skip,
        }
        values.update({(_RECORD, k): v for k, v in probe.after_step_pending().items()})
        if self.qk and probe.last_pass is not None:
            maxima = head_maxima(probe.last_pass.attention)
            values.update({(_QK, name): m for name, m in maxima.items()})
        self._pending = PendingStep(norms, HostCopy(values), saved[0], applied_lr)

    def take(self) -> SettledStep | None:
        """The deferred step's facts (a step late: no stall), or None without one."""
        pending, self._pending = self._pending, None
        return pending.read() if pending is not None else None

    def check(self, step: SettledStep, decision: GuardDecision) -> None:
        """The device's gate skipped exactly where the host's decision does not update:
        both apply the same rules, so anything else is a bug to report, not to train on."""
        if step.skipped != (not decision.apply_update):
            device = "skipped" if step.skipped else "applied"
            host = ";".join(decision.events) or "apply"
            raise DeferredMismatch(
                f"step {decision.step}: the device's gate {device} the update, the host's "
                f"decision is {host!r} (loss {step.loss!r}, gradient norm {step.grad_norm!r}); "
                "please report this with the run file, and use Guard(sync='step') meanwhile"
            )

    def after(self, decision: GuardDecision) -> None:
        """A rescue rolls back now: the backward already made at the replaced weights is
        discarded at the next step (``skip:after_rescue``)."""
        self._discard_next = decision.rescue

    def take_discard(self) -> str:
        discard, self._discard_next = self._discard_next, False
        return "after_rescue" if discard else ""

    def forget(self) -> None:
        """A loaded state replaces the deferred step."""
        self._pending, self._discard_next = None, False


def make_sync(
    sync: str,
    model: nn.Module,
    optimizer: Any,
    *,
    policy: GuardPolicy,
    params: Sequence[torch.Tensor],
    probe: Any,
    qk: bool,
) -> ImmediateSync | DeferredSync:
    """The strategy of ``Guard(sync=...)``."""
    if not deferred_sync(sync, model, optimizer):
        return ImmediateSync()
    return DeferredSync(policy, optimizer, params, probe, qk)
