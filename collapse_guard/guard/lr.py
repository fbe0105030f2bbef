"""The LR multiplier around the optimizer step, under the rescues' cap.

The multiplier is set on every parameter group just before the step and the loop's own
LR put back right after, so it holds whether the loop sets ``group["lr"]`` every step or
a scheduler does (chainable schedulers read ``group["lr"]`` and must not see the
multiplier).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["lr_for_step", "restore_lr"]


def lr_for_step(optimizer: Any, multiplier: float, ceiling: float) -> tuple[list[float], float]:
    """Set every group's LR to the loop's x ``multiplier``, under the rescues' ``ceiling``,
    for the optimizer step; returns the loop's LRs (to put back after it) and the LR in
    force (group 0's)."""
    saved = [group["lr"] for group in optimizer.param_groups]
    factor = multiplier
    if saved[0] * factor > ceiling:  # the cap of the rescues
        factor = ceiling / saved[0]
    for group, lr in zip(optimizer.param_groups, saved, strict=True):
        group["lr"] = lr * factor
    return saved, saved[0] * factor


def restore_lr(optimizer: Any, saved: Sequence[float]) -> None:
    for group, lr in zip(optimizer.param_groups, saved, strict=True):
        group["lr"] = lr
