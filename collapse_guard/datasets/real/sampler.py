"""The config sampler: a sweep of runs where the learning rate alone does not tell.

Measured here (issue 3): at Adam LR >= ~0.05 without qk-layernorm the attention
collapses; LR alone then separates collapsing from healthy runs with AUROC ~0.9, and a
predictor trained on such a sweep learns nothing but the LR. So each run is drawn
from one of several *recipes*, mixed so that collapses also come at moderate LR
(faults, fragile set-ups) and high LR also comes with healthy runs (qk-layernorm):

==============  ======  =============================================================
recipe          weight  what it draws
==============  ======  =============================================================
``baseline``    0.11    moderate LR, any qk-norm: healthy, with the odd recovered spike
``high_lr_qk``  0.12    high LR with qk-layernorm from the start: hard negatives
``high_lr``     0.30    a safe LR re-warmed to a high one in mid-run, without
                        qk-norm: attention-entropy collapse at a spread of steps
``fault``       0.25    moderate LR plus one injected fault after a third of the
                        run; mild ones give recovered spikes, severe ones collapses
``fragile``     0.22    moderate LR in a fragile set-up: post-LN without warmup,
                        tiny beta2 and eps without clipping, or fp16 without a
                        loss scaler
==============  ======  =============================================================

Measured on the 300 runs of seed 0 (600 steps): 130 collapse, and 70 of them begin less
than 10 steps after the intervention that triggers them (median 5 steps after a re-warm
starts, 1 after an LR jump or optimizer reset): the log-uniform ramp is mostly a few steps
long, a jump. Those collapses can be caught, not forecast; the fragile set-ups diverge a
median 215 steps after their peak LR. Longer ramps would give forecastable collapses.

Every recipe also draws the nuisance knobs (depth and width, batch size, weight
decay, beta2, clipping, bf16, init scale, warmup, final LR) so that none of them gives the answer
away. Run ``i`` of a sweep depends only on ``(seed, i)``: a sweep of 10 is the first
10 runs of a sweep of 200, which is what makes a generation resumable.
"""

from __future__ import annotations

import math

import numpy as np

from collapse_guard.datasets.real.config import RealRunConfig

__all__ = ["RECIPES", "sample_config", "sample_configs"]

RECIPES: dict[str, float] = {
    "baseline": 0.11,
    "high_lr_qk": 0.12,
    "high_lr": 0.30,
    "fault": 0.25,
    "fragile": 0.22,
}

# (n_layer, d_model): the default shape most often. Measured over 200 runs of 700 steps
# (2 workers busy): 35 s a run for the default, 22 s shallow, 40 s deep-narrow, 54 s
# wide; the wide one is drawn rarely so that 200 runs fit in an hour on 2 cores
_SHAPES = ((2, 64), (1, 64), (3, 48), (2, 96))
_SHAPE_P = (0.6, 0.2, 0.15, 0.05)
# a step costs about linearly in the batch (measured with the probe, 2 workers busy:
# 35 / 48 / 77 ms at 8 / 16 / 24); batch 32 never collapsed in the measurements
_BATCHES = (8, 12, 16)
_BATCH_P = (0.35, 0.4, 0.25)


def _log_uniform(rng: np.random.Generator, low: float, high: float) -> float:
    return float(math.exp(rng.uniform(math.log(low), math.log(high))))


def _choice(rng: np.random.Generator, options, p=None):
    return options[int(rng.choice(len(options), p=p))]


# Weyl sequences (start + index * irrational, mod 1): the first n runs of a sweep hold
# each recipe and shape in its share +- 1 run, where independent draws would be off by
# +- sqrt(n) (seed 0 drew the 5 %-shape 19 times in 200). Still a function of (seed, index).
_STREAMS = {"recipe": (math.sqrt(5) - 1) / 2, "shape": math.sqrt(2) - 1}


def _stratified(seed: int, index: int, stream: str, options, p):
    start = np.random.default_rng([seed, len(_STREAMS), list(_STREAMS).index(stream)]).random()
    u = (start + index * _STREAMS[stream]) % 1.0
    return options[min(int(np.searchsorted(np.cumsum(p), u, side="right")), len(options) - 1)]


def _nuisance(rng: np.random.Generator, steps: int, shape: tuple[int, int]) -> dict:
    """Knobs every recipe draws the same way (the fragile recipe overrides some)."""
    n_layer, d_model = shape
    return {
        "n_layer": n_layer,
        "d_model": d_model,
        "batch_size": _choice(rng, _BATCHES, _BATCH_P),
        "qk_norm": bool(rng.random() < 0.5),
        "warmup_steps": int(steps * rng.uniform(0.02, 0.15)),
        "min_lr_ratio": _choice(rng, (0.1, 0.5, 1.0)),
        "beta2": _choice(rng, (0.95, 0.98, 0.99)),
        "weight_decay": _choice(rng, (0.0, 0.01, 0.1)),
        "grad_clip": _choice(rng, (1.0, 0.0), (0.6, 0.4)),
        "precision": _choice(rng, ("fp32", "bf16"), (0.75, 0.25)),
        # measured: 5x the 0.02 init std trained fine at LR 0.01; a knob, not a cause
        "init_scale": _log_uniform(rng, 0.5, 5.0),
    }


def _rewarm(rng: np.random.Generator, steps: int) -> dict:
    """Learn at a safe LR, then re-warm to a high one at a step anywhere in mid-run."""
    return {
        "lr": _log_uniform(rng, 2e-3, 1.2e-2),
        # after some learning, and early enough that the 100-200 steps the attention
        # takes to go one-hot (measured) still fall inside the run
        "rewarm_step": int(steps * rng.uniform(0.25, 0.65)),
        "rewarm_steps": int(_log_uniform(rng, 1, 0.25 * steps)),
        "rewarm_lr": _log_uniform(rng, 0.04, 0.25),
        # measured: decaying a re-warmed 0.1 to 0.05 let the loss drift back down
        "min_lr_ratio": float(rng.uniform(0.7, 1.0)),
    }


def _high_lr(rng: np.random.Generator, steps: int, knobs: dict) -> dict:
    # Measured: a run warmed to LR 0.06-0.11 at once has its attention one-hot by step
    # ~200 but its loss only plateaus (the best level is the collapsed one: no rise);
    # one that learned first and is then re-warmed past ~0.05 rises and stays up. The
    # re-warming step spreads the onsets over the run.
    return {"qk_norm": False, **_rewarm(rng, steps)}


def _fault(rng: np.random.Generator, steps: int, knobs: dict) -> dict:
    lr = _log_uniform(rng, 2e-3, 1.5e-2)
    # measured at LR ~0.01: grad_spike (x1e4, unclipped) and opt_reset give ~0.6-0.9 nat
    # spikes that recover within ~300 steps; an LR jump past ~0.05 rises and stays
    kind = _choice(
        rng, ("lr_jump", "grad_spike", "opt_reset", "corrupt_batch"), (0.35, 0.15, 0.25, 0.25)
    )
    fault_step = int(steps * rng.uniform(0.35, 0.8))  # late onsets, still inside the run
    drawn = {"lr": lr, "fault": kind, "fault_step": fault_step}
    if kind == "lr_jump":
        # aim the jump at an LR between safe (0.02) and certain collapse (0.3)
        scheduled = RealRunConfig(**{**knobs, "lr": lr, "steps": steps}).lr_at(fault_step)
        drawn["fault_scale"] = _log_uniform(rng, 0.02, 0.3) / scheduled
    elif kind == "grad_spike":
        drawn["fault_scale"] = _log_uniform(rng, 1e2, 1e5)
        drawn["fault_steps"] = int(rng.integers(1, 6))
    elif kind == "corrupt_batch":
        drawn["fault_steps"] = int(_log_uniform(rng, 1, steps * 0.15))
    return drawn


def _fragile(rng: np.random.Generator, steps: int, knobs: dict) -> dict:
    # post-LN stalled rather than collapsed in all of 6 runs (seed 0, 700 steps): kept
    # as a fragile-looking negative, drawn less than the two that collapse (~2/3 of runs)
    mechanism = _choice(rng, ("post_ln", "adam_eps", "fp16"), (0.1, 0.5, 0.4))
    if mechanism == "post_ln":  # post-LN without warmup (Xiong et al. 2020): measured
        # here it stalls ~0.6 nats above a pre-LN run rather than collapsing
        return {
            "pre_ln": False,
            "warmup_steps": int(steps * rng.uniform(0.0, 0.02)),
            "lr": _log_uniform(rng, 0.01, 0.05),
        }
    warmup = int(steps * rng.uniform(0.02, 0.4))  # divergence comes near the peak LR
    if mechanism == "adam_eps":  # a jumpy second moment with nothing to bound the update
        return {
            # measured: beta2 0.5 diverged at LR 0.0085 and 0.02, 0.82 trained fine
            "beta2": float(rng.uniform(0.5, 0.75)),
            "eps": _log_uniform(rng, 1e-12, 1e-10),
            "grad_clip": 0.0,
            "lr": _log_uniform(rng, 3e-3, 3e-2),
            "warmup_steps": warmup,
        }
    # fp16 without a loss scaler: activations overflow to inf, the loss goes NaN
    # (measured: at LR 0.054 and 0.08; at 0.026-0.044 it trained fine)
    return {
        "precision": "fp16",
        "grad_clip": 0.0,
        "lr": _log_uniform(rng, 0.05, 0.15),
        "warmup_steps": warmup,
    }


def _recipe_knobs(recipe: str, rng: np.random.Generator, steps: int, knobs: dict) -> dict:
    if recipe == "baseline":
        return {"lr": _log_uniform(rng, 1e-3, 1.5e-2)}
    if recipe == "high_lr_qk":
        # measured: qk-norm at 0.08 from the start trains well (a hard negative), but
        # does not save a run re-warmed to 0.1 in mid-run (+0.38 nats): no re-warming
        return {"qk_norm": True, "lr": _log_uniform(rng, 0.03, 0.15)}
    if recipe == "high_lr":
        return _high_lr(rng, steps, knobs)
    if recipe == "fault":
        return _fault(rng, steps, knobs)
    return _fragile(rng, steps, knobs)


def sample_config(seed: int, index: int, steps: int = RealRunConfig.steps) -> RealRunConfig:
    """Config of run ``index`` of the sweep drawn with ``seed``."""
    rng = np.random.default_rng([seed, index])
    recipe = _stratified(seed, index, "recipe", tuple(RECIPES), tuple(RECIPES.values()))
    knobs = _nuisance(rng, steps, _stratified(seed, index, "shape", _SHAPES, _SHAPE_P))
    knobs.update(_recipe_knobs(recipe, rng, steps, knobs))
    run_seed = int(rng.integers(2**31))
    return RealRunConfig(recipe=recipe, seed=run_seed, steps=steps, **knobs)


def sample_configs(n: int, seed: int = 0, steps: int = RealRunConfig.steps) -> list[RealRunConfig]:
    """The first ``n`` configs of the sweep drawn with ``seed``."""
    return [sample_config(seed, i, steps) for i in range(n)]
