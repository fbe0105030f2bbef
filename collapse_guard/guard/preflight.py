"""Preflight: where a configuration lies outside the seed's safe ranges, say so once.

=================  ===================================================================
setting            the seed's safe range
=================  ===================================================================
peak LR            1e-5 to 3e-4, the top lowered 20% per 10B parameters
gradient clipping  0.5 to 1.0 (global L2 norm)
dropout            0.05 to 0.1
warmup             present: the LR rises over the first steps
=================  ===================================================================

These are the seed's ranges for large models; a small model trains well above 3e-4
(the real runs here use 1e-3 to 1e-2), so these are warnings, never errors. The warmup
check needs the LRs of the first steps: :class:`WarmupCheck` is fed them by the guard.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import nn

__all__ = ["WARMUP_CHECK_STEPS", "WarmupCheck", "lr_ceiling", "preflight_warnings"]

LR_FLOOR, LR_CEILING = 1e-5, 3e-4
CLIP_RANGE = (0.5, 1.0)
DROPOUT_RANGE = (0.05, 0.1)
WARMUP_CHECK_STEPS = 10  # a warmup raises the LR within its first steps; 10 steps tell


def lr_ceiling(n_params: int) -> float:
    """The seed's top LR for a model of ``n_params``: 3e-4, 20% lower per 10B parameters."""
    return LR_CEILING * max(0.0, 1.0 - 0.2 * n_params / 10e9)


def preflight_warnings(model: nn.Module, lrs: Sequence[float], clip: float) -> list[str]:
    """What lies outside the seed's ranges (module table), one sentence each."""
    out = []
    n_params = sum(p.numel() for p in model.parameters())
    ceiling = lr_ceiling(n_params)
    peak = max(lrs, default=math.nan)
    # 1e-9: 3e-4 is in range for any small model, whose ceiling is 3e-4 x (1 - 1e-9)
    if math.isfinite(peak) and peak > 0 and not LR_FLOOR <= peak <= ceiling * (1 + 1e-9):
        out.append(
            f"LR {peak:g} is outside the seed's safe range {LR_FLOOR:g}-{ceiling:.3g} for "
            f"{n_params:,} parameters (fine for small models; the guard watches it)"
        )
    if not clip:
        out.append("gradient clipping is off (GuardPolicy.clip=0); the seed's range is 0.5-1.0")
    elif not CLIP_RANGE[0] <= clip <= CLIP_RANGE[1]:
        out.append(f"clipping at {clip:g} is outside the seed's range 0.5-1.0 (GuardPolicy.clip)")
    drops = [m.p for m in model.modules() if isinstance(m, nn.Dropout)]
    odd = sorted({p for p in drops if not DROPOUT_RANGE[0] <= p <= DROPOUT_RANGE[1]})
    if odd:
        out.append(f"dropout {odd} is outside the seed's range 0.05-0.1")
    return out


class WarmupCheck:
    """Fed the LR of the first steps; ``done`` with a warning when none of them rose."""

    def __init__(self, steps: int = WARMUP_CHECK_STEPS) -> None:
        self.steps, self.lrs = steps, []

    def add(self, lr: float) -> str | None:
        """The warning once ``steps`` LRs are in and the LR never rose; else None."""
        if len(self.lrs) >= self.steps:
            return None
        self.lrs.append(float(lr))
        if len(self.lrs) < self.steps:
            return None
        if all(b <= a for a, b in zip(self.lrs, self.lrs[1:], strict=False)):
            return (
                f"no warmup: the LR did not rise over the first {self.steps} steps "
                f"({self.lrs[0]:g} -> {self.lrs[-1]:g}); the seed warms up linearly "
                "(collapse_guard.guard.warmup_cosine)"
            )
        return None
