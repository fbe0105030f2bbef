"""Preflight: where a configuration lies outside the seed's safe ranges, say so once.

=================  ===================================================================
setting            the safe range
=================  ===================================================================
peak LR            1e-5 to the larger of the seed's top (3e-4, lowered 20% per 10B
                   parameters) and the size-scaled top (:func:`lr_top`)
gradient clipping  0.5 to 1.0 (global L2 norm)
dropout            0.05 to 0.1
warmup             present: the LR rises over the first steps
=================  ===================================================================

The seed's LR range is for large models; small models train well above 3e-4, and a rule
that warned on the LRs everyone uses for them would be noise that teaches users to ignore
it. The size-scaled top is an upper envelope of GPT-3's table of peak LRs (Brown et al.
2020, table 2.1: 6e-4 at 125M parameters, 2e-4 at 1.3B, 1.2e-4 at 6.7B, 6e-5 at 175B):
6e-4 x (125M / N)^0.3 is at or above every row of the table, at most 1.6x it (3.0e-4 at
1.3B, 1.8e-4 at 6.7B, 6.8e-5 at 175B), and gives 1.25e-3 at nanoGPT's 10.7M-parameter
Shakespeare model (which trains at 1e-3). It is capped at 1e-2, the top of the real runs
here (100k-400k parameters), 4x under AdamW's measured stable edge there (0.04,
``sampler.STABLE_EDGE``). So 3e-4 does not warn up to a few billion parameters, 6e-4 up
to 125M, 1e-3 up to 22M. These are warnings, never errors. The warmup check needs the
LRs of the first steps: :class:`WarmupCheck` is fed them by the guard.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

from torch import nn

__all__ = [
    "WARMUP_CHECK_STEPS",
    "WarmupCheck",
    "lr_ceiling",
    "lr_top",
    "preflight_warnings",
    "warn_preflight",
]

LR_FLOOR, LR_CEILING = 1e-5, 3e-4
SCALED_LR, SCALED_AT, LR_CAP = 6e-4, 125e6, 1e-2  # GPT-3's 125M model; the cap (docstring)
SCALED_POWER = 0.3  # the envelope's slope: at or above every row of GPT-3's table
CLIP_RANGE = (0.5, 1.0)
DROPOUT_RANGE = (0.05, 0.1)
WARMUP_CHECK_STEPS = 10  # a warmup raises the LR within its first steps; 10 steps tell


def lr_ceiling(n_params: int) -> float:
    """The seed's top LR for a model of ``n_params``: 3e-4, 20% lower per 10B parameters."""
    return LR_CEILING * max(0.0, 1.0 - 0.2 * n_params / 10e9)


def lr_top(n_params: int) -> float:
    """The top of the safe LR range for ``n_params`` (module docstring): the seed's, or
    GPT-3's peak LRs scaled as N^(-0.3), whichever is higher, at most 1e-2."""
    scaled = SCALED_LR * (SCALED_AT / max(n_params, 1)) ** SCALED_POWER
    # 1e-9: 3e-4 is in range for any model of a few billion parameters or fewer
    return max(lr_ceiling(n_params), min(scaled, LR_CAP)) * (1 + 1e-9)


def preflight_warnings(model: nn.Module, lrs: Sequence[float], clip: float) -> list[str]:
    """What lies outside the safe ranges (module table), one sentence each."""
    out = []
    n_params = sum(p.numel() for p in model.parameters())
    top = lr_top(n_params)
    peak = max(lrs, default=math.nan)
    if math.isfinite(peak) and peak > 0 and not LR_FLOOR <= peak <= top:
        out.append(
            f"LR {peak:g} is outside the safe range {LR_FLOOR:g}-{top:.3g} for "
            f"{n_params:,} parameters (the seed's top, or GPT-3's scaled to this size; "
            "the guard watches it)"
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


def warn_preflight(model: nn.Module, optimizer: Any, clip: float) -> None:
    """:func:`preflight_warnings` of a guard's set-up, as warnings (at the ``Guard(...)``
    call)."""
    lrs = [float(g["lr"]) for g in optimizer.param_groups]
    for message in preflight_warnings(model, lrs, clip):
        warnings.warn(f"collapse-guard preflight: {message}", UserWarning, stacklevel=3)


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
