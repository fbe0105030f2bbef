"""Signal traces per signal group, as the probe would measure them on a small byte-level model.

Each builder takes one :class:`Ctx` (the run's spec, steps, LR, unit shapes and noise
generator) and returns ``{signal name: array over every step}``; measurement periods,
non-finite values after a divergence, AMP and gaps are applied afterwards in
``frame.py``. Healthy levels follow the small runs measured here (issue 3 and the real
runs of ``collapse_guard.datasets.real``, see ``realism.py``): a 1-3 layer byte-level
decoder, loss from ln(256) to about 1.8-2.7 nats after warmup with a per-step batch
noise of 0.1-0.2 nats, grad norm 0.2-1 (high during warmup), ``grad_cv`` 0.4-0.8 (over
the seed's 0.45 most of the time), ``update_cos`` ~0.9 (Adam's momentum makes
consecutive updates alike), ``attn_kl`` 0.1-0.7, attention logits ~5-30 when healthy
and 1e4-1e7 in an entropy collapse. Precursors are weak, as measured: mean attention
entropy and max logit drift by tenths (of a nat, of a decade) before onset, the
gradient norm gives no warning, and most collapses jump within a few steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from collapse_guard.datasets.synthetic.shapes import Shapes, smooth_noise
from collapse_guard.datasets.synthetic.spec import RunSpec

__all__ = [
    "Ctx",
    "attention_traces",
    "gradient_traces",
    "loss_trace",
    "output_traces",
    "system_traces",
    "update_traces",
]


@dataclass
class Ctx:
    """Everything a signal-group builder reads; ``loss_clean`` is set by :func:`loss_trace`."""

    spec: RunSpec
    t: np.ndarray  # steps as float
    lr: np.ndarray
    sh: Shapes
    rng: np.random.Generator
    loss_clean: np.ndarray | None = None  # loss without per-step noise and spikes

    def lognormal(self, sigma: float) -> np.ndarray:
        """Multiplicative per-step noise with median 1."""
        return np.exp(sigma * self.rng.standard_normal(self.t.size))

    def precursors(self) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
        """``(kind, drift, drift_kept)`` of each collapse kind whose precursors show.

        A collapse shows its own kind's (both shapes are ``sh.pre``), a healthy run its
        decoys' kinds (see ``Shapes.drift``). Each group applies a kind's precursors
        in one branch for both, so a decoy is the very precursor a collapse carries;
        what happens after onset reads ``sh.post``, ``sh.late`` and ``sh.after``,
        which are zero in a healthy run.
        """
        for kind, drift in self.sh.drift.items():
            yield kind, drift, self.sh.drift_kept[kind]

    @property
    def sudden(self) -> bool:
        """A collapse with no precursor drift (its ``pre`` is a step at onset)."""
        return self.spec.collapses and self.spec.lead == 0

    def dsi_target(self, low: tuple[float, float], high: tuple[float, float]) -> float:
        """A DSI excursion goes either below the band or above it: pick one side."""
        lo, hi = low if self.rng.random() < 0.5 else high
        return float(self.rng.uniform(lo, hi))

    @property
    def dsi_ramp(self) -> np.ndarray:
        """How far the DSI signals are over threshold: pre-onset ramp, or a false episode."""
        return np.maximum(self.sh.dsi_drift, self.sh.false_dsi)


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def loss_trace(c: Ctx) -> dict[str, np.ndarray]:
    spec, t, sh = c.spec, c.t, c.sh
    start = math.log(spec.vocab) + 0.05  # a fresh model predicts about uniformly
    # Fast warmup drop (most of the way) then a slow power-law-like improvement.
    curve = spec.loss_floor + (start - spec.loss_floor) * (
        0.65 * np.exp(-t / spec.tau_fast) + 0.35 * np.exp(-t / spec.tau_slow)
    )
    curve = curve + sh.pre_rise  # blow-up accelerates into the NaN (or a decoy's peak)
    if spec.onset is not None:
        # A collapsed run stops learning: the curve freezes at its onset value.
        curve = np.where(sh.after, curve[min(spec.onset, t.size - 1)], curve)
        if spec.kind != "nonfinite":
            since = np.maximum(t - spec.onset, 0.0)
            # Measured: a collapsed run slowly learns some of it back (never to within
            # the label's margin) ...
            relearn = c.rng.uniform(0.0, 0.4) * max(spec.rise - 0.3, 0.0)
            relearn = relearn * (1 - np.exp(-since / c.rng.uniform(100, 400)))
            curve = curve + spec.rise * sh.post - relearn * sh.after
            if spec.rise_steps < 30:
                # ... and a sudden one overshoots first (a jump that half comes back).
                peak = c.rng.uniform(0.2, 1.0) * spec.rise
                curve = curve + peak * sh.post * np.exp(-since / c.rng.uniform(3, 30))
    if "oscillation" in sh.drift:
        period = c.rng.uniform(4, 12)  # edge-of-stability bouncing, a few steps long
        amp = c.rng.uniform(0.04, 0.15) * (sh.drift["oscillation"] + sh.post)
        curve = curve + amp * np.sin(2 * math.pi * t / period)
    if spec.lr_change_factor > 1 and spec.lr_change_step is not None and spec.kind != "nonfinite":
        # A healthy LR raise costs a little loss that training wins back: a rise kept
        # under the label's margin, like the <= 0.23 nats healthy runs showed here.
        since = t - spec.lr_change_step
        hump = np.where(since >= 0, 1 - np.exp(-np.maximum(since, 0) / 20), 0.0)
        hump = hump * np.exp(-np.maximum(since, 0) / c.rng.uniform(100, 500))
        curve = curve + c.rng.uniform(0.05, 0.2) * hump
    c.loss_clean = curve
    # Per-step batch noise, louder early, plus a slow wobble (data mix drifting).
    sigma = spec.loss_noise * (1 + np.exp(-t / spec.tau_fast))
    if spec.onset is not None and spec.kind != "gradient_collapse":
        sigma = sigma * (1 + 0.5 * sh.post)  # a damaged model is noisier
    wobble = 0.25 * spec.loss_noise * smooth_noise(c.rng, t.size, tau=60.0)
    noise = sigma * c.rng.standard_normal(t.size) + wobble
    return {"loss": curve + noise + sh.bump + sh.data_spike}


def gradient_traces(c: Ctx) -> dict[str, np.ndarray]:
    spec, t, sh, rng = c.spec, c.t, c.sh, c.rng
    level = math.exp(rng.uniform(math.log(0.2), math.log(1.2)))
    warm_boost = rng.uniform(2.0, 10.0)  # grad norm is high while the loss falls fast
    g = level * (1 + warm_boost * np.exp(-t / (0.7 * spec.tau_fast + 20)))
    g = (
        g
        * np.exp(0.1 * smooth_noise(rng, t.size, tau=100.0))
        * c.lognormal(rng.uniform(0.08, 0.25))
    )
    g = g * (1 + rng.uniform(2, 10) * sh.bump_unit)
    g = np.where(sh.data_spike > 0, g * rng.uniform(3, 20), g)
    bottom = g * rng.uniform(0.2, 0.9) * c.lognormal(0.2)
    cv_level = rng.uniform(0.38, 0.82)  # real: 0.4-0.8, over the seed's 0.45 most of the time
    cv = cv_level + 0.2 * np.exp(-t / 150)
    cv_noise = c.lognormal(rng.uniform(0.05, 0.15))  # applied last: precursors are noisy too
    cv = np.where(sh.data_spike > 0, cv * rng.uniform(1.2, 2.0), cv)

    # One branch per precursor kind (Ctx.precursors): a collapse's own or a decoy's.
    for kind, drift, _ in c.precursors():
        if kind == "attention_entropy":
            # Measured here: gradient norm did not warn before onset; after, it shifts.
            g = g * rng.uniform(0.6, 1.6) ** sh.late
            bottom = bottom * rng.uniform(0.6, 1.6) ** sh.late
        elif kind == "nonfinite":
            # A decoy mimics the blow-up (an LR jump is a cause, not a precursor: sampler).
            blow = rng.uniform(1.0, 2.0) if spec.cause == "lr_jump" else rng.uniform(1.0, 3.0)
            g = g * 10 ** (blow * drift**2)
            bottom = bottom * 10 ** (blow * drift**2)
        elif kind == "gradient_collapse":
            # Vanishing starts at the bottom of the stack, then everything dies in one step.
            bottom = bottom * 10 ** (-rng.uniform(1.0, 2.5) * np.where(sh.after, 0.0, drift))
            g = np.where(sh.after, g * 10 ** -rng.uniform(3.3, 4.5), g)
            dead = 10 ** rng.uniform(-9.0, -7.0) * c.lognormal(0.3)
            bottom = np.where(sh.after, dead, bottom)
            cv = np.where(sh.after, cv + rng.uniform(0.5, 1.2), cv)
        elif kind == "oscillation":
            wiggle = np.exp(0.3 * drift * np.sin(t * rng.uniform(0.5, 1.5)))
            grow = 10 ** (rng.uniform(0.3, 1.0) * sh.late)
            g = g * (1 + 0.5 * drift) * wiggle * grow
            bottom = bottom * (1 + 0.5 * drift) * wiggle * grow
    dsi = c.dsi_ramp
    cv = (cv * (1 - dsi) + c.dsi_target((0.8, 1.3), (0.8, 1.3)) * dsi) * cv_noise
    return {
        "grad_norm": g,
        "bottom_grad_norm": bottom,
        "grad_cv": cv,
        "grad_nonfinite": np.zeros(t.size),
    }


def _param_norm(c: Ctx, larger: np.ndarray) -> np.ndarray:
    """Global parameter norm: grows from its init by 10-80%, at the pace of the updates.

    The norm is the sum of the updates, so it grows while the LR is high and stalls
    as it decays (a step schedule's raise speeds it up again), and it grows faster
    exactly when the updates are ``larger`` than a healthy run's (a blow-up, an
    oscillation, a collapse: the factor the update ratio carries), never on its own
    clock. The pace wobbles by a factor ~e^(0.3-0.8) over 50-200 steps, as the
    gradients' alignment does. Issue 8: a norm that only ever slows down, with a
    collapse's growth laid on top, made any acceleration a precursor only collapses
    had (param_norm took 31% of the bundled model's gain). The pace follows the LR
    up to twice its peak (a step schedule's raise): an LR jump's blow-up shows through
    ``larger``, as a blow-up's does.
    """
    spec, t, rng = c.spec, c.t, c.rng
    p0 = _log_uniform(rng, 15, 100)  # real: 30-170 (init scale is a knob)
    growth = rng.uniform(0.1, 0.8)
    wobble = np.exp(rng.uniform(0.3, 0.8) * smooth_noise(rng, t.size, tau=rng.uniform(50, 200)))
    pace = np.minimum(c.lr / spec.lr_peak, 2.0) * wobble * larger
    # e-folding after 300-3000 steps at the peak LR (the former time constant)
    progress = np.cumsum(pace) / rng.uniform(300, 3000)
    param = p0 * (1 + growth * (1 - np.exp(-progress)))
    return param * (1 + 1e-4 * np.cumsum(rng.standard_normal(t.size)) / np.sqrt(t.size))


def update_traces(c: Ctx) -> dict[str, np.ndarray]:
    t, sh, rng = c.t, c.sh, c.rng
    # Adam with beta1 = 0.9: consecutive updates share most of their momentum (real: 0.87-0.91).
    cos_level = rng.uniform(0.86, 0.915)
    # Adam's first updates all point the same way (momentum fills up): cos near 1.
    cos = cos_level + (0.97 - cos_level) * np.exp(-t / 20)
    cos_noise = rng.uniform(0.015, 0.05) * rng.standard_normal(t.size)  # applied last
    flip_p = np.full(t.size, rng.uniform(0.005, 0.05))  # momentum: reversals are rare
    ratio = c.lr * rng.uniform(1.5, 5) * c.lognormal(0.1)
    larger = np.ones(t.size)  # how much larger the updates are than a healthy run's

    for kind, drift, _ in c.precursors():
        if kind == "oscillation":
            # The precursor of this kind: updates reverse direction step after step.
            cos = cos * (1 - drift) + rng.uniform(-0.6, -0.1) * drift
            flip_p = flip_p * (1 - drift) + rng.uniform(0.65, 0.95) * drift
            larger = larger * (1 + drift + sh.late)
        elif kind == "attention_entropy":
            larger = larger * (1 + sh.late)
        elif kind == "nonfinite":
            larger = larger * 10 ** (rng.uniform(0.3, 1.5) * drift**2)
        elif kind == "gradient_collapse":
            cos = np.where(sh.after, rng.uniform(0.0, 0.3), cos)
            cos_noise = np.where(sh.after, 0.2 * rng.standard_normal(t.size), cos_noise)
            larger = np.where(sh.after, larger * rng.uniform(0.03, 0.2), larger)
    ratio = ratio * larger
    param = _param_norm(c, larger)
    dsi = c.dsi_ramp
    cos = cos * (1 - dsi) + c.dsi_target((-0.3, 0.05), (0.92, 0.97)) * dsi + cos_noise
    # "most reversals of any tensor in the last 10 steps": at most 9 possible, fewer early.
    flips = rng.binomial(np.minimum(t, 9).astype(np.int64), np.clip(flip_p, 0, 1)).astype(float)
    return {
        "update_cos": np.clip(cos, -1.0, 1.0),
        "update_flips": flips,
        "update_ratio": ratio,
        "param_norm": param,
    }


def attention_traces(c: Ctx) -> dict[str, np.ndarray]:
    spec, t, sh, rng = c.spec, c.t, c.sh, c.rng
    # Attention keeps sharpening over the whole run (real healthy 700-step runs: mean
    # entropy -0.13 nats, max logit +0.08 decades over 150 steps in mid-run), so a
    # collapse's precursor drifts sit on a background drift of the same sign.
    settle = 1 - np.exp(-t / (t.size * rng.uniform(0.2, 0.8)))
    # A fresh model attends about uniformly over up to 64 positions: mean ln(i) ~ 3.1.
    e_level = rng.uniform(1.3, 2.5)
    ent_mean = (3.1 + (e_level - 3.1) * settle) * c.lognormal(0.03)
    ent_min = (2.8 + (e_level * rng.uniform(0.5, 0.85) - 2.8) * settle) * c.lognormal(0.06)
    logit_level = _log_uniform(rng, 5, 50)
    logit = (rng.uniform(1, 3) + (logit_level - 2) * settle) * c.lognormal(0.05)
    kl_level = _log_uniform(rng, 0.08, 0.6)
    kl = kl_level + (rng.uniform(1.5, 4) - kl_level) * np.exp(-t / rng.uniform(30, 150))
    heads = int(rng.choice([4, 8, 12, 16]))
    sat_p = np.full(t.size, rng.uniform(0.0, 0.02))  # real healthy runs: 0

    # Recovered spikes dip entropy and lift logits briefly (Wortsman et al. 2023).
    ent_mean = ent_mean * (1 - 0.3 * sh.bump_unit)
    ent_min = ent_min * (1 - 0.5 * sh.bump_unit)
    logit = logit * (1 + rng.uniform(0.2, 1.0) * sh.bump_unit)
    if spec.benign_logit_growth > 0:
        # High-LR healthy runs (with qk-norm in real life): logits grow, then saturate.
        start = rng.uniform(0.1, 0.5) * t.size
        sat = np.clip(1 - np.exp(-(t - start) / rng.uniform(100, 400)), 0.0, 1.0)
        logit = logit * 10 ** (spec.benign_logit_growth * sat)
        ent_mean = ent_mean * (1 - 0.2 * sat)
        ent_min = ent_min * (1 - 0.8 * sat)  # some heads turn one-hot
        sat_p = sat_p + 0.12 * sat
    for kind, drift, kept in c.precursors():
        if kind == "attention_entropy":
            # Weak precursors, as measured on the real runs: a few tenths of a decade of
            # logit growth and of a nat of entropy before onset (when there is a lead).
            # A decoy's sharpening stays (drift_kept), as benign logit growth does.
            a_pre = 0.0 if c.sudden else rng.uniform(0.0, 0.5)
            final = rng.uniform(4.0, 7.0)  # log10 of the final max logit: 1e4 .. 1e7
            since = t - (spec.onset if spec.onset is not None else t.size)
            grow = np.clip(since / (max(spec.rise_steps, 1) * rng.uniform(1, 2)), 0, 1)
            grow = np.where(sh.after, grow**3, 0.0)
            collapse_gain = max(final - math.log10(logit_level) - a_pre, 0) * grow
            logit = logit * 10 ** (a_pre * kept + collapse_gain)
            d_pre = 0.0 if c.sudden else rng.uniform(0.04, 0.25)
            # The heads turn one-hot as the loss goes up, not before it shows (a slow
            # start, cubed): the label's onset sits inside a slow rise, and a collapse
            # that is over before the loss shows it would be a precursor no real run has.
            late = sh.late
            ent_mean = ent_mean * (1 - d_pre * kept)
            ent_mean = ent_mean * (1 - late) + rng.uniform(0.02, 0.3) * late
            ent_min = ent_min * (1 - min(1.5 * d_pre, 0.9) * kept)
            ent_min = ent_min * (1 - late) + 10 ** rng.uniform(-4, -1.7) * late
            sat_p = sat_p + 0.1 * drift + rng.uniform(0.4, 0.8) * late
            kl = kl * (1 + 2 * sh.late)
        elif kind == "nonfinite":
            logit = logit * 10 ** (rng.uniform(0.0, 0.5) * kept**2)
        elif kind == "gradient_collapse":
            kl = np.where(sh.after, rng.uniform(0.003, 0.05), kl)
            sat_p = sat_p + rng.uniform(0.5, 0.9) * sh.post
        elif kind == "oscillation":
            logit = logit * (1 + 0.5 * kept + sh.late)
            kl = kl * (1 + sh.late)
    dsi = c.dsi_ramp
    kl = (kl * (1 - dsi) + c.dsi_target((0.03, 0.18), (1.6, 3.5)) * dsi) * c.lognormal(0.3)
    saturation = rng.binomial(heads, np.clip(sat_p, 0, 1)) / heads
    kl[0] = math.nan  # the first probe has no previous attention to compare with
    return {
        "attn_entropy_mean": ent_mean,
        "attn_entropy_min": np.minimum(ent_min, ent_mean),
        "attn_logit_max": logit,
        "attn_kl": kl,
        "attn_saturation": saturation,
    }


def output_traces(c: Ctx) -> dict[str, np.ndarray]:
    spec, t, sh, rng = c.spec, c.t, c.sh, c.rng
    assert c.loss_clean is not None, "loss_trace must run before output_traces"
    level = rng.uniform(7, 25)  # real: 8-25
    logit = (1.0 + (level - 1.0) * (1 - np.exp(-t / rng.uniform(100, 800)))) * c.lognormal(0.03)
    logit = np.where(sh.data_spike > 0, logit * rng.uniform(1.2, 2.0), logit)
    # A calibrated model's predictive entropy sits just under its loss.
    entropy = np.minimum(c.loss_clean - rng.uniform(0.0, 0.15), math.log(spec.vocab))
    entropy = entropy + 0.03 * rng.standard_normal(t.size)
    # Early on the model predicts the most frequent byte everywhere, then diversifies.
    rep_level = rng.uniform(0.3, 0.55)  # real: 0.3-0.55 (byte text: spaces, "e")
    rep = rep_level + (0.85 - rep_level) * np.exp(-t / rng.uniform(60, 200)) * (1 - np.exp(-t / 8))
    rep = rep + 0.02 * rng.standard_normal(t.size)
    for kind, drift, _ in c.precursors():
        if kind == "nonfinite":
            logit = logit * 10 ** (rng.uniform(1.0, 3.0) * drift**2)
        elif kind == "attention_entropy":
            logit = logit * (1 + rng.uniform(0, 1) * sh.late)
            entropy = entropy * (1 - rng.uniform(0.2, 0.6) * sh.post)  # overconfident
            rep = rep * (1 - sh.post) + rng.uniform(0.5, 1.0) * sh.post
        elif kind == "gradient_collapse":
            logit = logit * (1 - 0.5 * sh.post)
            rep = rep * (1 - sh.post) + rng.uniform(0.6, 1.0) * sh.post
        elif kind == "oscillation":
            logit = logit * (1 + drift + sh.late)
    return {
        "output_logit_max": logit,
        "output_entropy": np.maximum(entropy, 0.0),
        "output_repetition": np.clip(rep, 0.0, 1.0),
    }


def system_traces(c: Ctx) -> dict[str, np.ndarray]:
    """Host memory always; GPU power and memory only on GPU runs (NaN otherwise)."""
    spec, t, rng = c.spec, c.t, c.rng
    n = t.size
    host = rng.uniform(4e9, 100e9) * (1 - rng.uniform(0, 0.05) * t / n) * c.lognormal(0.005)
    if spec.gpu:
        power = rng.uniform(60, 400) * (1 - 0.4 * np.exp(-t / 50)) * c.lognormal(0.05)
        mem = rng.uniform(0.5e9, 70e9) * np.where(t == 0, 0.6, 1.0) * c.lognormal(0.002)
    else:
        power = mem = np.full(n, math.nan)
    return {"host_mem_available": host, "gpu_power_w": power, "gpu_mem_used": mem}
