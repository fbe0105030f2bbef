"""An fp16 GradScaler, replayed over a run's gradient norms.

PyTorch's ``GradScaler`` multiplies the loss by ``scale`` (2^16 at first); a step
whose scaled gradients overflow fp16 is skipped and halves the scale, and every
2,000 consecutive good steps double it. The scale is a running state, so this is the
one sequential loop of the generator (a few microseconds a step, AMP runs only).
"""

from __future__ import annotations

import numpy as np

__all__ = ["GROWTH_INTERVAL", "INIT_SCALE", "replay_grad_scaler"]

INIT_SCALE = 2.0**16  # torch.amp.GradScaler default init_scale
GROWTH_INTERVAL = 2000  # torch default: double after this many steps without overflow
_FP16_LOG2_MAX = 16.0  # fp16 max is 65504 ~ 2^16


def replay_grad_scaler(
    grad_norm: np.ndarray, forced: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``(scale, overflow)`` per step for a run with these (unscaled) gradient norms.

    A step overflows when scale x its largest gradient element passes the fp16 range;
    the largest element is the norm times a per-run factor with some per-step jitter.
    ``forced`` marks steps that overflow whatever the scale (a diverged model).
    """
    headroom = rng.uniform(-4.0, 2.0)  # log2 of max-element / norm, per model
    log_peak = (
        np.log2(np.maximum(grad_norm, 1e-30)) + headroom + 0.7 * rng.standard_normal(grad_norm.size)
    )
    over_at = (_FP16_LOG2_MAX - log_peak).tolist()  # overflow when log2(scale) > this
    forced_list = forced.tolist()
    scale = np.empty(grad_norm.size)
    overflow = np.zeros(grad_norm.size)
    log2_scale = float(np.log2(INIT_SCALE))
    good = 0
    for i, (limit, force) in enumerate(zip(over_at, forced_list, strict=True)):
        scale[i] = 2.0**log2_scale
        if force or log2_scale > limit:
            overflow[i] = 1.0
            log2_scale -= 1.0
            good = 0
        else:
            good += 1
            if good == GROWTH_INTERVAL:
                log2_scale += 1.0
                good = 0
    return scale, overflow
