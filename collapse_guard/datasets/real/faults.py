"""Injected faults: the accidents of real fleets, reproduced on purpose at a chosen step.

=================  ==================================================================
fault              what happens from ``fault_step`` on
=================  ==================================================================
``corrupt_batch``  ``fault_steps`` batches of uniformly random bytes (a corrupt shard)
``grad_spike``     gradients multiplied by ``fault_scale`` for ``fault_steps`` steps,
                   before the probe and the clipping see them (a bad reduction)
``opt_reset``      AdamW's second moments zeroed once, first moments and step count
                   kept (a resume that lost ``exp_avg_sq``): the next updates are
                   ``m / sqrt((1 - beta2) g^2)``, several times lr, and ``m / eps``
                   wherever the fresh gradient is near zero. A full wipe is benign
                   with Adam (measured: no visible loss change), so it is not used
``lr_jump``        the LR multiplied by ``fault_scale`` until the end (a bad config push)
=================  ==================================================================

The loop calls the hooks at fixed places (see ``runner.train``); each is a no-op on
the steps the fault does not touch, so a clean run goes through the same code.
"""

from __future__ import annotations

from collapse_guard.datasets.real.config import RealRunConfig

__all__ = ["FaultInjector"]


class FaultInjector:
    """Applies ``config.fault`` at ``config.fault_step`` (see the module table)."""

    def __init__(self, config: RealRunConfig):
        self.kind = config.fault
        self.start = config.fault_step
        self.length = config.fault_steps
        self.scale = config.fault_scale

    def _active(self, step: int) -> bool:
        return self.start <= step < self.start + self.length

    def lr_multiplier(self, step: int) -> float:
        """Factor on the scheduled LR at ``step``."""
        if self.kind == "lr_jump" and step >= self.start:
            return self.scale
        return 1.0

    def batch(self, step: int, x, y, generator):
        """``(x, y)``, or while corrupting, random bytes of the same shape."""
        if self.kind != "corrupt_batch" or not self._active(step):
            return x, y
        import torch

        noise = torch.randint(0, 256, (x.shape[0], x.shape[1] + 1), generator=generator)
        return noise[:, :-1], noise[:, 1:]

    def after_backward(self, step: int, model) -> None:
        """Scale the gradients in place (``grad_spike``), before anything measures them."""
        if self.kind != "grad_spike" or not self._active(step):
            return
        import torch

        grads = [p.grad for p in model.parameters() if p.grad is not None]
        torch._foreach_mul_(grads, self.scale)

    def before_step(self, step: int, optimizer) -> None:
        """Zero AdamW's second moments (``opt_reset``) just before the step at ``fault_step``."""
        if self.kind != "opt_reset" or step != self.start:
            return
        for state in optimizer.state.values():
            state["exp_avg_sq"].zero_()
