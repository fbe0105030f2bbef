"""Time courses shared by the signal groups: schedule, ramps, spikes, smooth noise.

Every function is vectorised over the step axis ``t`` (float array, 0 .. n-1) and
draws no randomness except through the generator it is handed, so one run costs a
few array passes whatever its length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from collapse_guard.datasets.synthetic.spec import RunSpec

__all__ = [
    "DATASET_SPIKE_ENTROPY",
    "N_DATASETS",
    "Shapes",
    "dataset_spikes",
    "lr_schedule",
    "make_shapes",
    "smooth_noise",
]

# A "dataset" is a fixed data order: its bad batches sit at the same steps in every run
# that reads it, whatever the run's seed (modded-nanogpt records show one-step spikes at
# steps 919, 947 and 5335 in runs of different seeds and optimizers:
# ../shared/realdata/derived/modded_nanogpt_runs_summary.csv). The entropy is fixed so
# the spike steps are a property of the dataset, not of the generator's seed.
DATASET_SPIKE_ENTROPY = 0x5EED_DA7A
N_DATASETS = 12


def dataset_spikes(dataset: int) -> tuple[tuple[int, float], ...]:
    """``(step, height in nats)`` of the one-step data spikes of ``dataset``.

    0-4 spikes per dataset between step 150 and 5,000 (the longest synthetic run);
    heights 0.5-2.5 nats (the real records count spikes > 1 nat; smaller ones exist).
    """
    rng = np.random.default_rng(np.random.SeedSequence(DATASET_SPIKE_ENTROPY, spawn_key=(dataset,)))
    count = int(rng.integers(0, 5))
    steps = np.sort(rng.choice(np.arange(150, 5000), size=count, replace=False))
    heights = rng.uniform(0.5, 2.5, size=count)
    return tuple((int(s), round(float(h), 4)) for s, h in zip(steps, heights, strict=True))


def lr_schedule(spec: RunSpec, t: np.ndarray) -> np.ndarray:
    """Learning rate per step: linear warmup, then cosine / constant / one step change.

    Warmup counts from (t + 1) / warmup as nanoGPT does, so step 0 already moves.
    The nonfinite "lr_jump" cause multiplies the LR from ``lr_change_step`` on.
    """
    warm = np.minimum((t + 1.0) / max(spec.warmup, 1), 1.0)
    if spec.schedule == "cosine":
        # The cosine is planned for the run's full length; a crash or gap does not change it.
        progress = np.clip((t - spec.warmup) / max(spec.n_steps - spec.warmup, 1), 0.0, 1.0)
        decay = spec.lr_min_frac + (1 - spec.lr_min_frac) * 0.5 * (1 + np.cos(math.pi * progress))
    else:
        decay = np.ones_like(t)
    lr = spec.lr_peak * warm * decay
    if spec.lr_change_step is not None:
        lr = np.where(t >= spec.lr_change_step, lr * spec.lr_change_factor, lr)
    return lr


def smooth_noise(rng: np.random.Generator, n: int, tau: float) -> np.ndarray:
    """Unit-variance noise correlated over about ``tau`` steps (exponential kernel).

    Slow wobble of a level (loss plateaus, grad-norm drift) that white noise lacks;
    a truncated convolution keeps it vectorised.
    """
    width = max(int(4 * tau), 1)
    kernel = np.exp(-np.arange(width) / tau)
    kernel /= np.sqrt(np.sum(kernel**2))
    white = rng.standard_normal(n + width)
    return np.convolve(white, kernel, mode="valid")[:n]


@dataclass(frozen=True)
class Shapes:
    """Unit time courses of one run; each signal group scales them with its own constants."""

    pre: np.ndarray  # 0 until onset - lead, rises (quadratically) to 1 at onset, then 1
    post: np.ndarray  # 0 until onset, smoothstep to 1 over rise_steps, then 1
    # post cubed: what moves with the collapse's heads and norms, not ahead of the loss.
    # The label's onset comes 0-70 steps after the generator's (its smoothed loss must
    # cross the margin, measured on 400 runs of seed 0); on ``post`` itself, norms and
    # logits would show the collapse to a window before the loss does, which no real
    # run was seen to (issue 3: the logits turn as the loss rises).
    late: np.ndarray
    after: np.ndarray  # bool, t >= onset
    bump: np.ndarray  # recovered spikes: loss excess in nats (sum over spikes)
    bump_unit: np.ndarray  # recovered spikes: 0..1 (for the other signals' excursions)
    data_spike: np.ndarray  # one-step data spikes: loss excess in nats at those steps
    false_dsi: np.ndarray  # healthy false-precursor episode: 0..1 plateau
    # How far each kind's precursors have developed, 0..1, by collapse kind: a
    # collapse has its own kind's, ``pre``; a healthy run one per decoy kind, the same
    # quadratic ramp into the decoy's peak, then a return to 0 (``drift``) or a level
    # that stays (``drift_kept``: a parameter norm or sharpened attention that grew
    # stays grown), the largest where decoys of one kind overlap.
    drift: dict[str, np.ndarray]
    drift_kept: dict[str, np.ndarray]
    dsi_drift: np.ndarray  # how far the DSI signals are over threshold (collapse or decoy)
    pre_rise: np.ndarray  # loss rise into a blow-up, nats: nonfinite collapses and decoys


def _smoothstep(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, 0.0, 1.0)
    return x * x * (3 - 2 * x)


def _ramp(t: np.ndarray, end: int, lead: int) -> np.ndarray:
    """0 until ``end - lead``, then up to 1 at ``end`` and 1 after (a step at ``end``
    when ``lead`` is 0). Quadratic: drifts start slow and accelerate into onset, as
    logit growth does."""
    if lead <= 0:
        return (t >= end).astype(float)
    return np.clip((t - (end - lead)) / lead, 0.0, 1.0) ** 2


def make_shapes(spec: RunSpec, t: np.ndarray, rng: np.random.Generator) -> Shapes:
    n = t.size
    drift: dict[str, np.ndarray] = {}
    drift_kept: dict[str, np.ndarray] = {}
    dsi_drift = pre_rise = np.zeros(n)
    if spec.onset is None:
        pre = post = np.zeros(n)
        after = np.zeros(n, dtype=bool)
        for d in spec.decoys:
            kept = _ramp(t, d.peak, d.lead)
            back = kept * np.exp(-np.maximum(t - d.peak, 0.0) / max(d.fade, 1.0))
            drift[d.kind] = np.maximum(drift.get(d.kind, 0.0), back)
            drift_kept[d.kind] = np.maximum(drift_kept.get(d.kind, 0.0), kept)
            dsi_drift = np.maximum(dsi_drift, back) if d.dsi else dsi_drift
            pre_rise = pre_rise + d.rise * back**2
    else:
        after = t >= spec.onset
        pre = _ramp(t, spec.onset, spec.lead)
        drift[spec.kind] = drift_kept[spec.kind] = pre
        dsi_drift = pre if spec.dsi else dsi_drift
        pre_rise = spec.rise * pre**2 if spec.kind == "nonfinite" else pre_rise
        post = _smoothstep((t - spec.onset) / max(spec.rise_steps, 1))
        post = np.where(after, post, 0.0)
    bump = np.zeros(n)
    bump_unit = np.zeros(n)
    for s in spec.spikes:
        up = np.clip((t - s.step + 1) / s.rise, 0.0, 1.0)
        down = np.exp(-np.clip(t - (s.step + s.rise - 1), 0.0, None) / s.decay)
        shape = np.where(t < s.step, 0.0, up * down)
        bump += s.height * shape
        bump_unit = np.maximum(bump_unit, shape)
    data_spike = np.zeros(n)
    # Each run sees the dataset's bad batch a little differently (its own model state).
    for step, height in dataset_spikes(spec.dataset):
        if step < n:
            data_spike[step] = height * rng.uniform(0.7, 1.3)
    false_dsi = np.zeros(n)
    if spec.false_dsi is not None:
        start, length = spec.false_dsi
        edge = max(length // 4, 1)
        rise = np.clip((t - start) / edge, 0.0, 1.0)
        fall = np.clip((start + length - t) / edge, 0.0, 1.0)
        false_dsi = np.minimum(rise, fall)
    return Shapes(
        pre,
        post,
        post**3,
        after,
        bump,
        bump_unit,
        data_spike,
        false_dsi,
        drift,
        drift_kept,
        dsi_drift,
        pre_rise,
    )
