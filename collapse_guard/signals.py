"""The signal contract: canonical names, signal groups, seed thresholds and default periods.

Every part agrees on this table: the probe emits these names, run files store one
column each, features read them, the service accepts them. It imports nothing heavy
(no torch, no pandas) so that any part can depend on it.

A signal not measured at a step is NaN. A measured non-finite value (NaN loss,
infinite gradient norm) is data; its companion flag (``loss_nonfinite``) says it was
measured.

========================  ==========  =============================================
name                      group       what
========================  ==========  =============================================
loss                      output      training loss of the step
loss_nonfinite            output      1 when the measured loss was NaN/inf, else 0
lr                        output      learning rate of the first param group
grad_norm                 gradient    global L2 norm of gradients, before clipping
grad_cv                   gradient    coefficient of variation of per-layer grad norms
bottom_grad_norm          gradient    grad norm of the lowest transformer block
grad_nonfinite            gradient    number of non-finite gradient elements
update_cos                update      cosine of consecutive parameter updates (sketch)
update_flips              update      most sign reversals of any tensor's update in 10 steps
update_ratio              update      largest per-layer ||update|| / ||param||
param_norm                update      global parameter norm
attn_kl                   attention   mean KL(attention now || attention at previous probe)
attn_saturation           attention   fraction of heads with near-identical token outputs
attn_entropy_min          attention   smallest per-head attention entropy (nats)
attn_entropy_mean         attention   mean per-head attention entropy (nats)
attn_logit_max            attention   largest pre-softmax attention logit
output_logit_max          output      largest output logit magnitude
output_entropy            output      mean next-token entropy on the probe batch
output_repetition         output      share of positions whose argmax is the modal argmax
loss_scale                amp         GradScaler scale (NaN without AMP)
overflow                  amp         1 when the scaler found inf/NaN gradients
host_mem_available        system      MemAvailable from /proc/meminfo, bytes
gpu_power_w               system      GPU power draw, watts (NaN without NVML)
gpu_mem_used              system      GPU memory used, bytes (NaN without a GPU)
sharpness                 curvature   top Hessian eigenvalue (power iteration)
sharpness_lr              curvature   sharpness x lr (edge of stability when near 2)
opt_v_lag_frac            optimizer   Adam: share of sketch coords with g^2 < v_hat/10
opt_v_lag_log             optimizer   Adam: mean log(g^2 / v_hat) (eps-floored, nats)
opt_m_rms                 optimizer   Adam: RMS of the bias-corrected first moment
opt_v_rms                 optimizer   Adam: RMS of 1 / (sqrt(v_hat) + eps)
opt_update_rms            optimizer   RMS of the update / lr (sketch)
opt_update_spread         optimizer   std of ln(update/weight norm ratio) over matrices
opt_momentum_cos          optimizer   cosine of the momentum with the gradient
opt_sign_agree            optimizer   Lion: share of coords moved against the gradient
opt_ortho_rms             optimizer   Muon: RMS of the update / lr on its matrices
stability_margin          optimizer   lr x curvature along the update / threshold (1: edge)
line_edge                 line        curvature term along the step / its first-order term
line_descent              line        probe-batch decrease of the step / first-order term
line_double               line        the same for a step twice as long (< 0: overshoot)
========================  ==========  =============================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "DSI_SIGNALS",
    "SIGNALS",
    "SIGNAL_NAMES",
    "Signal",
    "signal",
]


@dataclass(frozen=True)
class Signal:
    """One stability signal.

    ``low``/``high`` are the seed's alarm thresholds: the signal is "over threshold"
    when it is below ``low`` or above ``high`` (either may be None). ``period`` is the
    default number of steps between measurements (0 means off by default).
    """

    name: str
    group: str  # the signal group (what the probe measures it with); "family" is a model's
    period: int = 1
    low: float | None = None
    high: float | None = None

    def over_threshold(self, value: float) -> bool:
        """True when a finite ``value`` lies outside the seed's healthy band."""
        if not math.isfinite(value):
            return False
        return (self.low is not None and value < self.low) or (
            self.high is not None and value > self.high
        )

    @property
    def family(self) -> str:
        """The old name of :attr:`group`, kept for one release."""
        import warnings

        warnings.warn(
            "Signal.family is now Signal.group (signal groups; 'family' names a model "
            "family); the old name goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.group

    @property
    def has_threshold(self) -> bool:
        return self.low is not None or self.high is not None


SIGNALS: tuple[Signal, ...] = (
    # output group: what the loop hands the probe
    Signal("loss", "output", high=10.0),  # seed: 2.3-2.8 normal, >10 at collapse (large models)
    Signal("loss_nonfinite", "output"),
    Signal("lr", "output"),
    # gradient group: one pass over gradients, before clipping
    Signal("grad_norm", "gradient"),
    Signal("grad_cv", "gradient", high=0.45),  # DSI gradient health
    Signal("bottom_grad_norm", "gradient", low=1e-6),  # vanishing gradient precursor
    Signal("grad_nonfinite", "gradient"),
    # update group: from a fixed random sketch of each parameter tensor
    Signal("update_cos", "update", low=0.1, high=0.9),  # DSI update consistency
    Signal("update_flips", "update", high=4.5),  # seed: >= 5 reversals in 10 steps
    Signal("update_ratio", "update"),
    Signal("param_norm", "update"),
    # attention group: a fixed probe batch every `period` steps
    Signal("attn_kl", "attention", period=10, low=0.2, high=1.5),  # DSI activation entropy change
    Signal("attn_saturation", "attention", period=10, high=0.40),
    Signal("attn_entropy_min", "attention", period=10),
    Signal("attn_entropy_mean", "attention", period=10),
    Signal("attn_logit_max", "attention", period=10),
    # output group, measured on the loss's logits or the probe batch
    Signal("output_logit_max", "output"),
    Signal("output_entropy", "output", period=10),
    Signal("output_repetition", "output", period=10),
    # AMP
    Signal("loss_scale", "amp"),
    Signal("overflow", "amp"),
    # system telemetry
    Signal("host_mem_available", "system", period=100),
    Signal("gpu_power_w", "system", period=100),
    Signal("gpu_mem_used", "system", period=100),
    # curvature: costly, off by default
    Signal("sharpness", "curvature", period=0),
    Signal("sharpness_lr", "curvature", period=0),
    # optimizer group: the optimizer's state at the update sketch's coordinates, every 10
    # steps (and the step before, for the margin's consecutive gradients)
    Signal("opt_v_lag_frac", "optimizer", period=0),
    Signal("opt_v_lag_log", "optimizer", period=0),
    Signal("opt_m_rms", "optimizer", period=0),
    Signal("opt_v_rms", "optimizer", period=0),
    Signal("opt_update_rms", "optimizer", period=0),
    Signal("opt_update_spread", "optimizer", period=0),
    Signal("opt_momentum_cos", "optimizer", period=0),
    Signal("opt_sign_agree", "optimizer", period=0),
    Signal("opt_ortho_rms", "optimizer", period=0),
    Signal("stability_margin", "optimizer", period=0),  # Cohen et al. 2022's threshold
    # line group: the probe batch's loss along the step just taken, at 0, 1 and 2 times it
    Signal("line_edge", "line", period=0),  # 1: gradient descent's edge of stability
    Signal("line_descent", "line", period=0),
    Signal("line_double", "line", period=0),
)

SIGNAL_NAMES: tuple[str, ...] = tuple(s.name for s in SIGNALS)

# The seed's Dynamic Stability Index: collapse is flagged when all three are over threshold.
DSI_SIGNALS: tuple[str, ...] = ("grad_cv", "attn_kl", "update_cos")

_BY_NAME = {s.name: s for s in SIGNALS}


def signal(name: str) -> Signal:
    """Look up a signal by its canonical name."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(
            f"unknown signal {name!r}; known signals are {', '.join(SIGNAL_NAMES)}"
        ) from None
