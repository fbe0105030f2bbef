"""<UNSCALE> and <MEASURE>: the step's gradient norms, the scaler's verdict, the loop's LR.

Every function reads and returns; none changes training (the scaler's ``unscale_``
aside, which the guard owes a loop with a ``GradScaler`` before it can measure).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from collapse_guard.guard.reactive import jump_starts, lr_jumped  # the LR-jump rule lives there

__all__ = [
    "amp_enabled",
    "amp_overflow",
    "clip_coefficient",
    "host_floats",
    "jump_starts",
    "lr_jumped",
    "tensor_norms",
    "trainable",
    "unscale",
]


def trainable(model: Any) -> tuple[tuple[str, ...], list[torch.Tensor]]:
    """The names and tensors of ``model``'s trainable parameters: what the guard measures."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return tuple(n for n, _ in named), [p for _, p in named]


def tensor_norms(probe: Any, params: Sequence[torch.Tensor]) -> torch.Tensor:
    """Every trainable tensor's gradient norm (0 without a gradient), on the device:
    the probe's, from its one pass over the gradients, where it measured them."""
    shared = probe.tensor_norms
    if shared is not None and len(shared) == len(params):
        return shared
    grads = [p.grad for p in params]
    present = [g for g in grads if g is not None]
    if not present:
        return torch.zeros(len(grads))
    norms = iter(torch._foreach_norm(present))
    device = present[0].device
    return torch.stack(
        [
            next(norms).float().to(device) if g is not None else torch.zeros((), device=device)
            for g in grads
        ]
    )


def clip_coefficient(clip_to: float, total: torch.Tensor) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_``'s factor from the total norm, in its float ops
    (a float32 tensor, scalar over tensor, clamped at 1): a guard whose rules are all
    quiet trains the plain loop's run bit for bit, not a run one rounding away that
    drifts by the trajectory's noise (0.02-0.05 nats in 600 steps: benchmarks/README.md,
    "Guard rescue, per configuration")."""
    return torch.clamp(clip_to / (total + 1e-6), max=1.0)


def host_floats(*values: torch.Tensor) -> list[float]:
    """0-d tensors as floats: one copy to the host for a device's, ``float`` on the CPU
    (no device to wait for; a stack and copies cost ~20 us there)."""
    if all(v.device.type == "cpu" for v in values):
        return [float(v) for v in values]
    return torch.stack([v.cpu() for v in values]).tolist()


def amp_enabled(scaler: Any) -> bool:
    return scaler is not None and scaler.is_enabled()


def _scaler_state(scaler: Any, optimizer: Any) -> dict:
    return scaler._per_optimizer_states.get(id(optimizer), {})


def unscale(scaler: Any, optimizer: Any) -> None:
    """``scaler.unscale_(optimizer)`` unless the loop did already (Lightning does, for its
    clipping hook; unscaling twice is an error)."""
    if (
        amp_enabled(scaler)
        and getattr(_scaler_state(scaler, optimizer).get("stage"), "name", "") != "UNSCALED"
    ):
        scaler.unscale_(optimizer)


def amp_overflow(scaler: Any, optimizer: Any) -> bool:
    """The scaler found inf or NaN in this step's gradients (its own skip, not the guard's)."""
    if not amp_enabled(scaler):
        return False
    found = _scaler_state(scaler, optimizer).get("found_inf_per_device", {})
    return bool(sum(v.item() for v in found.values()))  # sync only under AMP
