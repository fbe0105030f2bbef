"""How the window features read each signal's level: as it is, scale-free, or shift-free.

A model trained on 100k-parameter runs must read a 1B-parameter run. Where the level
of a signal depends on the model's size or family, a feature that reads the raw level
(its last value, mean, min, max or slope) learns the size of the training runs' models,
not their stability. Each signal is therefore read one of three ways:

==========  ====================================================================
reading     window statistics (``<signal>__<stat>``)
==========  ====================================================================
``level``   the level means the same on any model: last, mean, std, min, max,
            slope, ewma_ratio, zscore, frac_over (seed threshold), nonfinite
``ratio``   the level scales with the model: every statistic is divided by the
            window's mean, so multiplying the signal by any c > 0 leaves them
            unchanged: last_rel, std_rel (coefficient of variation), min_rel,
            max_rel, slope_rel (per step: the growth rate, ~ d log x / dt),
            ewma_ratio, zscore, nonfinite. No frac_over: a seed threshold on
            such a signal (bottom_grad_norm < 1e-6) is a raw level too
``shift``   the level has an offset set by the data (the loss starts at about
            log(vocabulary size)): statistics relative to the window's mean:
            last_dev, std, min_dev, max_dev, slope (nats per step), ewma_dev
            (short minus long EWMA), zscore, nonfinite
==========  ====================================================================

The run's own references (its early levels, its long-run averages, its best loss) are
in the run context (:mod:`collapse_guard.features.context`), as ratios too.
"""

from __future__ import annotations

from types import MappingProxyType

__all__ = ["READINGS", "reading"]

LEVEL, RATIO, SHIFT = "level", "ratio", "shift"

_RATIO_REASONS = {
    # a norm summed over all parameters grows as sqrt(number of parameters) and with
    # the initialisation's scale; AMP loss scaling multiplies gradients by the scale
    "grad_norm": "global L2 norm: sqrt(parameters), init scale, AMP scale",
    "bottom_grad_norm": "one block's L2 norm: its width, the model's depth",
    "param_norm": "global L2 norm: sqrt(parameters) times the init std",
    # ||update|| / ||param|| per layer: ~ lr / init std for Adam-like optimizers, so it
    # scales with width (init std ~ 1/sqrt(width)) and with the optimizer's own LR scale
    "update_ratio": "~ lr x sqrt(width) for Adam; another scale for SGD or Lion",
    # logits scale with the head dimension, the qk scaling and the family (qk-norm,
    # tied embeddings); their growth, not their size, is the precursor
    "attn_logit_max": "head dimension, qk scaling and norm of the family",
    "output_logit_max": "vocabulary, tied embeddings, output scaling of the family",
    # the LR's scale is the optimizer's (AdamW 1e-3, SGD 0.1, Lion 1e-4) and the size's;
    # where it stands in its own schedule is the run context's
    "lr": "set per optimizer and model size",
    "loss_scale": "a power of two chosen by the GradScaler's initial scale",
    "sharpness": "top Hessian eigenvalue: depends on the parametrisation",
    # the optimizer's state: the gradient's scale (m), its inverse (1/sqrt(v)); the
    # update per unit LR is dimensionless for Adam and Lion but the gradient's scale for
    # SGD, and Muon's is set by its LR adjustment (0.2 x sqrt(fan) or sqrt(shape ratio))
    "opt_m_rms": "the gradient's scale: loss scale, width, AMP",
    "opt_v_rms": "1 / the gradient's scale",
    "opt_update_rms": "~1 for Adam and Lion, the momentum's scale for SGD",
    "opt_ortho_rms": "Muon's LR adjustment (adjust_lr_fn) and the matrices' shapes",
    # machine telemetry: the machine and the model's size (the model does not read them,
    # predictor.training.data.MODEL_SIGNALS; kept scale-free for any model that does)
    "host_mem_available": "bytes of the machine",
    "gpu_power_w": "watts of the GPU model",
    "gpu_mem_used": "bytes: the model's size and batch",
}
_SHIFT_REASONS = {
    # cross-entropy starts near log(vocabulary): 5.5 nats for bytes, 10.8 for GPT-2's
    # 50k tokens; its moves (nats) mean the same on both, its level does not
    "loss": "offset log(vocabulary size) at initialisation",
}

# Every other signal is dimensionless or bounded (cosines, fractions, counts in a fixed
# range, entropies that collapse towards 0, sharpness x lr near 2 at the edge of
# stability, the stability margin near 1 there, log(g^2 / v) and the spread of
# ln(update / weight) in nats): its level means the same on any model, and its seed
# threshold applies.
READINGS = MappingProxyType(
    {**dict.fromkeys(_RATIO_REASONS, RATIO), **dict.fromkeys(_SHIFT_REASONS, SHIFT)}
)


def reading(name: str) -> str:
    """``"level"``, ``"ratio"`` or ``"shift"``: how the window features read ``name``."""
    return READINGS.get(name, LEVEL)
