"""Injected faults: the accidents of real fleets, reproduced on purpose at a chosen step.

=================  ==================================================================
fault              what happens from ``fault_step`` on
=================  ==================================================================
``corrupt_batch``  ``fault_steps`` batches of uniformly random tokens (a corrupt shard)
``grad_spike``     gradients multiplied by ``fault_scale`` for ``fault_steps`` steps,
                   before the probe and the clipping see them (a bad reduction)
``opt_reset``      the optimizer's second moments (AdamW's ``exp_avg_sq``; see
                   ``config.SECOND_MOMENTS``, refused for the others) zeroed once,
                   first moments and step count kept (a resume that lost
                   ``exp_avg_sq``): the next updates are ``m / sqrt((1 - beta2) g^2)``,
                   several times lr, and ``m / eps``
                   wherever the fresh gradient is near zero. A full wipe is benign
                   with Adam (measured: no visible loss change), so it is not used
``lr_jump``        the LR multiplied by ``fault_scale`` until the end (a bad config push)
``lr_ramp``        the LR multiplier rising linearly from 1 to ``fault_scale`` over
                   ``fault_steps`` steps, then held (a slowly rising LR: a schedule
                   bug, a warmup restarted by a resume): the collapse develops
``corrupt_ramp``   a share of random tokens in every batch, rising linearly from 0 to
                   ``fault_scale`` over ``fault_steps`` steps, then held (a data
                   pipeline going bad shard by shard)
=================  ==================================================================

The loop calls the hooks at fixed places (see ``runner.train``); each is a no-op on
the steps the fault does not touch, so a clean run goes through the same code.
"""

from __future__ import annotations

from collapse_guard.datasets.real.config import SECOND_MOMENTS, RealRunConfig

__all__ = ["FaultInjector"]


class FaultInjector:
    """Applies ``config.fault`` at ``config.fault_step`` (see the module table)."""

    def __init__(self, config: RealRunConfig):
        self.kind = config.fault
        self.start = config.fault_step
        self.length = config.fault_steps
        self.scale = config.fault_scale
        self.vocab_size = config.vocab_size
        self.moments = SECOND_MOMENTS.get(config.optimizer, ())

    def _active(self, step: int) -> bool:
        return self.start <= step < self.start + self.length

    def _ramp(self, step: int) -> float:
        """Progress of a ramp fault: 0 before ``fault_step``, 1 from its last ramp step on."""
        if step < self.start:
            return 0.0
        return min(1.0, (step - self.start + 1) / self.length)

    def lr_multiplier(self, step: int) -> float:
        """Factor on the scheduled LR at ``step``."""
        if self.kind == "lr_jump" and step >= self.start:
            return self.scale
        if self.kind == "lr_ramp":
            return 1.0 + (self.scale - 1.0) * self._ramp(step)
        return 1.0

    def batch(self, step: int, x, y, generator):
        """``(x, y)``, or while corrupting, random tokens in all or part of it."""
        if self.kind == "corrupt_batch" and self._active(step):
            import torch

            noise = torch.randint(
                0, self.vocab_size, (x.shape[0], x.shape[1] + 1), generator=generator
            )
            return noise[:, :-1], noise[:, 1:]
        if self.kind == "corrupt_ramp" and step >= self.start:
            import torch

            tokens = torch.cat((x, y[:, -1:]), dim=1)
            hit = torch.rand(tokens.shape, generator=generator) < self.scale * self._ramp(step)
            noise = torch.randint(0, self.vocab_size, tokens.shape, generator=generator)
            tokens = torch.where(hit, noise, tokens)
            return tokens[:, :-1], tokens[:, 1:]
        return x, y

    def after_backward(self, step: int, model) -> None:
        """Scale the gradients in place (``grad_spike``), before anything measures them."""
        if self.kind != "grad_spike" or not self._active(step):
            return
        import torch

        grads = [p.grad for p in model.parameters() if p.grad is not None]
        torch._foreach_mul_(grads, self.scale)

    def before_step(self, step: int, optimizer) -> None:
        """Zero the second moments (``opt_reset``) just before the step at ``fault_step``."""
        if self.kind != "opt_reset" or step != self.start:
            return
        for state in optimizer.state.values():
            for key in self.moments:
                state[key].zero_()
