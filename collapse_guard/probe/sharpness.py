"""Curvature group: the top Hessian eigenvalue, off by default (it costs backward passes).

=================  ==============================================================
key                meaning
=================  ==============================================================
``sharpness``      largest-magnitude eigenvalue of the loss Hessian w.r.t. the
                   trainable parameters, by ``sharpness_iters`` steps of power
                   iteration with Hessian-vector products (double backward)
``sharpness_lr``   sharpness x lr: gradient descent is unstable along the top
                   direction beyond 2 (edge of stability, Cohen et al. 2021)
=================  ==============================================================

The loss comes from a closure: ``Probe(..., loss_closure=fn)`` (or
``probe.loss_closure = fn``) where ``fn()`` returns a scalar loss on a small batch;
without one, the probe batch is run through the model and the loss is taken from its
output (a scalar tensor, the first scalar of a tuple, ``.loss`` or ``["loss"]``). The
probe runs this group in eval mode with the RNG forked; ``torch.autograd.grad`` never
touches ``.grad``, so training is untouched. The start vector comes from the group's
own generator.
"""

from __future__ import annotations

import warnings

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from collapse_guard.probe.state import ProbeState, SignalGroup

__all__ = ["SharpnessGroup", "top_eigenvalue"]


def top_eigenvalue(
    loss: torch.Tensor, params: list[torch.Tensor], iters: int, generator: torch.Generator
) -> torch.Tensor:
    """Power iteration on the Hessian of ``loss``; returns a 0-d device tensor."""
    grads = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
    # parameters the loss does not use, or uses linearly, have a zero Hessian block
    pairs = [
        (p, g) for p, g in zip(params, grads, strict=True) if g is not None and g.requires_grad
    ]
    if not pairs:
        return torch.zeros((), device=loss.device)
    params, grads = [p for p, _ in pairs], [g for _, g in pairs]
    vector = [torch.randn(p.shape, generator=generator).to(p.device, p.dtype) for p in params]
    eigenvalue = torch.zeros((), device=loss.device)
    for _ in range(iters):
        norm = torch.sqrt(sum(v.square().sum() for v in vector)).clamp_min(1e-30)
        vector = [v / norm for v in vector]
        product = torch.autograd.grad(grads, params, grad_outputs=vector, retain_graph=True)
        # Rayleigh quotient v^T H v with |v| = 1: no .item(), the loop stays on the device
        eigenvalue = sum((h * v).sum() for h, v in zip(product, vector, strict=True))
        vector = [h.detach() for h in product]
    return eigenvalue.detach()


def loss_of(output: object) -> torch.Tensor | None:
    """The scalar loss inside a model's output, or None."""
    if isinstance(output, torch.Tensor):
        return output if output.dim() == 0 else None
    if isinstance(output, (tuple, list)):
        return next((o for o in output if isinstance(o, torch.Tensor) and o.dim() == 0), None)
    if isinstance(output, dict):
        return output.get("loss")
    return getattr(output, "loss", None)


class SharpnessGroup(SignalGroup):
    keys = ("sharpness", "sharpness_lr")
    period_field = "sharpness_every"
    isolated = True  # needs grad; the probe gives eval mode and a forked RNG

    def reset(self) -> None:
        super().reset()
        # its own stream, distinct from the sketch's: never the global RNG
        self._generator = torch.Generator().manual_seed(self.config.sketch_seed + 1)
        self._warned = False

    def _warn(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"collapse-guard: sharpness is NaN: {why}. Set probe.loss_closure to a "
                "function returning a scalar loss on a small batch",
                RuntimeWarning,
                stacklevel=4,
            )

    def update(self, state: ProbeState) -> SharpnessGroup:
        if state.loss_closure is None:
            self._warn("no loss closure and no probe batch")
            return self
        params = [p for p in state.model.parameters() if p.requires_grad]
        try:
            # fused SDPA kernels have no double backward; the math one is plain autograd
            with sdpa_kernel(SDPBackend.MATH):
                loss = state.loss_closure()
                if not isinstance(loss, torch.Tensor) or loss.dim() != 0 or not loss.requires_grad:
                    self._warn(f"the closure returned {type(loss).__name__}, not a scalar loss")
                    return self
                value = top_eigenvalue(loss, params, self.config.sharpness_iters, self._generator)
        except RuntimeError as error:  # e.g. a fused attention kernel without double backward
            self._warn(f"{type(error).__name__}: {error}")
            return self
        self._values = {"sharpness": value, "sharpness_lr": value * state.lr}
        return self
