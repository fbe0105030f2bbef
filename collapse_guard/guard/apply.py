"""<APPLY>: the only place where a decision changes training.

Clipping (the level's global bound, outlier tensors, the rescues' layer caps), the LR
multiplier under the rescues' cap and the warn's hold around the optimizer step (lr.py,
warn_hold.py), the step itself (the scaler's under AMP), a QK-clip plan, and the probe's
record of the step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from collapse_guard.guard.decision import GuardDecision
from collapse_guard.guard.forensics import GradientHistory
from collapse_guard.guard.lr import lr_for_step, restore_lr
from collapse_guard.guard.measure import amp_enabled, clip_coefficient
from collapse_guard.guard.policy import GuardPolicy
from collapse_guard.guard.setup import GuardSetup
from collapse_guard.guard.warn_hold import WarnHold

__all__ = ["Applier", "clip_gradients", "optimizer_step"]


def clip_gradients(
    decision: GuardDecision,
    grad_norm: float,
    norms: torch.Tensor,
    *,
    layer_bounds: Mapping[str, float],
    history: GradientHistory,
    policy: GuardPolicy,
    params: Sequence[torch.Tensor],
    index: Mapping[str, int],
) -> None:
    """Outlier tensors (warn and above) and capped layers to their bounds, then the whole
    gradient to the decision's global bound."""
    bounds = dict(layer_bounds)
    if decision.clip_layers:
        medians = history.outliers(norms, policy.layer_outlier_ratio)
        for name in decision.clip_layers:
            if name in medians:
                bounds.setdefault(name, policy.layer_outlier_ratio * medians[name])
    clipped = False
    for name, bound in bounds.items():
        i = index.get(name)
        grad = params[i].grad if i is not None else None
        if grad is not None:
            norm = float(norms[i])
            if norm > bound:
                grad.mul_(bound / (norm + 1e-6))
                clipped = True
    if decision.clip_to > 0:
        grads = [p.grad for p in params if p.grad is not None]
        if clipped:  # the layer clipping changed the norm: measure it again
            torch.nn.utils.clip_grad_norm_(params, decision.clip_to, foreach=True)
        elif grad_norm > decision.clip_to * (1 - 1e-6) - 1e-6:  # the factor may be under 1
            coef = clip_coefficient(decision.clip_to, torch.linalg.vector_norm(norms))
            torch._foreach_mul_(grads, coef)


def optimizer_step(optimizer: Any, scaler: Any) -> None:
    """The update: the scaler's step under AMP (it skips an overflow itself)."""
    if amp_enabled(scaler):
        scaler.step(optimizer)
    else:
        optimizer.step()


class Applier:
    """Executes a decision on one model: clipping, the LR multiplier (and the warn's
    hold: ``hold``), the optimizer step (or none), the scaler's update, a QK-clip plan,
    and the probe's record of the step."""

    def __init__(self, setup: GuardSetup) -> None:
        self.setup = setup
        self.hold = WarnHold()

    def __call__(
        self,
        decision: GuardDecision,
        grad_norm: float,
        norms: torch.Tensor,
        qk_plan: dict,
        *,
        layer_bounds: Mapping[str, float],
        lr_ceiling: float,
    ) -> tuple[dict[str, float], list[str], tuple[float, float] | None]:
        """The probe's record (``lr``: the LR in force, multiplier included), the events
        of the hold and of QK-clip, and group 0's LR in force and the loop's (None: no
        update was applied)."""
        setup = self.setup
        optimizer, scaler = setup.training.optimizer, setup.training.scaler
        saved = in_force = None
        held: list[str] = []
        if decision.apply_update and not decision.rescue:
            clip_gradients(
                decision, grad_norm, norms, layer_bounds=layer_bounds, history=setup.history,
                policy=setup.policy, params=setup.params, index=setup.index,
            )  # fmt: skip
            unheld = min(optimizer.param_groups[0]["lr"] * decision.lr_multiplier, lr_ceiling)
            held = self.hold.update(decision.level, unheld, setup.policy)
            ceiling = min(lr_ceiling, self.hold.ceiling)
            saved, in_force = lr_for_step(optimizer, decision.lr_multiplier, ceiling)
            optimizer_step(optimizer, scaler)
        if amp_enabled(scaler):
            scaler.update()
        qk = setup.qk
        clipped = qk.apply(qk_plan) if qk and qk_plan and not decision.rescue else []
        record = setup.probe.after_step()
        if saved is None:
            return record, clipped, None
        restore_lr(optimizer, saved)
        return record, [*held, *clipped], (in_force, saved[0])
