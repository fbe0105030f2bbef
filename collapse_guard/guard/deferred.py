"""The guard's deferred steps (``Guard(sync="deferred")``): a healthy-looking step's update
gated on the device, its facts read by the host at the next step.

A mixin of :class:`~collapse_guard.guard.guard.Guard`, kept apart because it is one
path through a step with its own rules: which steps may defer (``_healthy_decision``),
the device's gate (``_apply_deferred``, with ``device_gate.py``) and the booking a step
late (``_settle``), which must decide exactly as a step read at once would.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from collapse_guard.guard import ddp
from collapse_guard.guard.decision import GuardDecision, decide
from collapse_guard.guard.device_gate import (
    GateBands,
    HostCopy,
    can_skip_on_device,
    gated_step,
    skip_flag,
)
from collapse_guard.guard.qk_clip import head_maxima
from collapse_guard.signals import SIGNAL_NAMES

__all__ = ["DeferredSteps", "deferred_sync"]

_QK_MAXIMA = "__qk:"  # a deferred step's head maxima, by module, among its facts


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


class DeferredSteps:
    """The deferred path of :class:`Guard` (module docstring); it reads and writes the
    guard's own state."""

    _defer: bool
    _pending: tuple | None
    _discard_next: bool

    def _healthy_decision(self, s: int, stale: str) -> GuardDecision | None:
        """Step ``s``'s decision if its loss and gradients are healthy, where nothing else
        needs them before the update (then the device gates the update and the host reads
        the facts at the next step); None where this step reads its facts now.

        Read now (one sync): ``sync="step"``; DDP (rank 0's decision is broadcast); AMP
        (the scaler's own skip); a QK-clip plan to apply (a head over tau at the last
        probe pass, whose maxima a deferred step copies with its facts); a stale step; a
        forced action; warn or critical (outlier layers are clipped by their norms); the
        first step after a rollback and data-fault mode (their rules read this step's
        loss); layer caps from a rescue; and every step that checkpoints (the parameters
        are read for finiteness).
        """
        if not self._defer or stale or self._forced is not None or self.qk_pending:
            return None
        if self.level not in ("ok", "watch") or self.after_rollback or self.data_fault:
            return None
        amp = self.scaler is not None and self.scaler.is_enabled()
        if amp or self.layer_bounds or ddp.is_distributed():
            return None
        facts = replace(self._facts(s, 0.0, 1.0), loss_z=math.nan, grad_z=math.nan)
        decision = decide(replace(facts, collapse_online=False), self.policy)
        return decision if decision.apply_update and not decision.checkpoint else None

    def _gate_bands(self, s: int) -> GateBands:
        p = self.policy
        z = p.critical_outlier_z if self.level == "critical" else p.outlier_z
        if self.skip_streak >= p.max_outlier_skips and not self._lr_jumped():
            z = math.inf  # outliers are accepted now (decision.py); after an LR jump they rescue
        online = self.online
        return GateBands(
            self.loss_history.band(),
            self.grad_history.band(),
            z,
            online.smoothed,
            online.alpha,
            online.collapse_line(s),
        )

    def _apply_deferred(
        self, decision: GuardDecision, loss: torch.Tensor, total: torch.Tensor, norms
    ) -> None:
        """The update of a healthy-looking step, gated on the device by the reactive rules;
        its facts go to the host for :meth:`_settle`, with no sync now."""
        skip = skip_flag(loss, total, self._gate_bands(self.step_index))
        if decision.clip_to > 0:  # _clip's global clipping, on the device, same float ops
            total64 = total.double()  # a full tensor divided, not scalar / tensor (torch's
            # reciprocal-then-multiply rounds differently from the host's division)
            coef = torch.full_like(total64, decision.clip_to) / (total64 + 1e-6)
            coef = torch.where(total64 > decision.clip_to, coef, 1.0).float()
            torch._foreach_mul_([p.grad for p in self.params if p.grad is not None], coef)
        in_force = self.lr_in_force
        saved = self._lr_with_multiplier(decision)
        gated_step(self.optimizer, skip)
        self._restore_lr(saved, warmup=False)  # the warm-up check counts applied steps
        applied_lr, self.lr_in_force = self.lr_in_force, in_force
        facts = {"__loss": loss, "__grad_norm": total, "__skip": skip}
        pending = self.probe.after_step_pending()
        if self.qk is not None and self.probe.last_pass is not None:
            maxima = head_maxima(self.probe.last_pass.attention)
            pending.update({_QK_MAXIMA + name: m for name, m in maxima.items()})
        self._pending = (norms, HostCopy({**facts, **pending}), saved[0], applied_lr)

    def _settle(self) -> None:
        """Book the deferred step: read its facts (a step late: no stall), decide it as
        the host would have, and book it. Its decision is that of a step read at once:
        the device's gate applied exactly the rules that skip or rescue (asserted here).
        A rescue rolls back now; the backward already made at the replaced weights is
        then discarded (``skip:after_rescue``)."""
        if self._pending is None:
            return
        norms, copy, loop_lr, applied_lr = self._pending
        self._pending = None
        values = copy.read()
        loss_value, grad_norm = values.pop("__loss"), values.pop("__grad_norm")
        skipped = values.pop("__skip") > 0
        maxima = {
            k[len(_QK_MAXIMA) :]: values.pop(k) for k in list(values) if k.startswith(_QK_MAXIMA)
        }
        record = dict.fromkeys(SIGNAL_NAMES, math.nan)
        record.update(values)
        stale = "zero_gradients" if grad_norm == 0.0 else ""
        if stale:
            self._warn_stale(stale)
        decision = self._decide(self.step_index, loss_value, grad_norm, norms, stale)
        assert skipped == (not decision.apply_update), (decision, loss_value, grad_norm)
        if decision.give_up:
            self._give_up(decision)
        self.lr_multiplier = decision.lr_multiplier
        if decision.apply_update:
            self.lr_in_force = applied_lr
            self._check_warmup(loop_lr)
        self.qk_pending = self._qk_plan(decision, maxima)
        self._book(decision, norms, record, [])
        self._discard_next = decision.rescue
