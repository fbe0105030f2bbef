"""The seed's LR schedule as a torch scheduler: linear warmup, then cosine to a floor.

>>> scheduler = warmup_cosine(optimizer, warmup_steps=100, total_steps=2000)
>>> for step in range(2000):
...     ...; guard.step(loss); optimizer.zero_grad(); scheduler.step()

It is a ``LambdaLR``: the LR of a step is ``base_lr x factor(step)``, computed afresh,
never from the previous LR. The guard's LR multiplier is applied around the optimizer
step and undone after it (:mod:`collapse_guard.guard.guard`), so it composes with this
scheduler, with chainable ones (which read ``group["lr"]``) and with loops that set
``group["lr"]`` themselves.
"""

from __future__ import annotations

import math

import torch

__all__ = ["warmup_cosine", "warmup_cosine_factor"]


def warmup_cosine_factor(
    step: int, warmup_steps: int, total_steps: int, min_ratio: float = 0.0
) -> float:
    """Factor on the peak LR at ``step``: (step + 1) / warmup, then cosine to ``min_ratio``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + 0.5 * (1.0 - min_ratio) * (1.0 + math.cos(math.pi * progress))


def warmup_cosine(
    optimizer: torch.optim.Optimizer,
    warmup_steps: int,
    total_steps: int,
    min_ratio: float = 0.0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` of the seed's schedule (cosine to zero by default, as the seed says)."""
    if warmup_steps < 0 or total_steps < 1 or not 0.0 <= min_ratio <= 1.0:
        raise ValueError(
            f"expected warmup_steps >= 0, total_steps >= 1 and min_ratio in [0, 1]; got "
            f"{warmup_steps}, {total_steps}, {min_ratio}"
        )
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine_factor(step, warmup_steps, total_steps, min_ratio)
    )
