"""The config sampler: families, optimizers, data and recipes, mixed so that LR alone does not tell.

Issue 8 measured the 300-run sweep of the first sampler (one family, AdamW, bytes):
70 of its 130 collapses began less than 10 steps after their trigger (its re-warm
ramps were mostly jumps), so a predictor learned too little about collapses that
develop. This sampler draws, for run ``i`` of seed ``s``:

* a **family** (``models/``: gpt, rope_swiglu, mha), an **optimizer** (adamw, lion,
  sgd) and a **data** kind (bytes, or the procedural language with 64, 128 or 512
  ids), each stratified, so the evaluation can leave one family out;
* a **recipe**, whose LRs are multiples of the family x optimizer's measured
  ``STABLE_EDGE`` (the LR past which a model that learned collapses when brought there
  over a ramp), so a recipe means the same for Lion at 0.005 as for AdamW at 0.05:

==================  ======  =========================================================
recipe              weight  what it draws (LRs as multiples of the edge)
==================  ======  =========================================================
``baseline``        0.08    0.1-0.5x: healthy
``safe_high_lr``    0.10    hard negatives: qk-norm at 1-2.5x (AdamW) or 1-1.5x
                            (Lion); mha and SGD: long warmup and clipping at 0.5-0.9x
``spike``           0.07    0.1-0.4x plus a fault runs recover from (a clipped
                            gradient spike, 1-29 random batches, AdamW's second
                            moments zeroed): recorded spikes, hard negatives
``constant_high``   0.15    warmup over 200-500 steps to a constant 2-6x, no qk-norm:
                            the model learns, then degrades past the edge (trigger:
                            step 0); or only plateaus (a high-LR negative)
``slow_ramp``       0.17    learn at 0.1-0.5x, re-warm over 100-300 steps to 2-4x
                            from 1/5 to 11/20 of the run: collapses that develop
``growing_fault``   0.13    an LR multiplier rising to 2-4x over 100-300 steps, or a
                            share of random tokens rising to 30-100%
``sudden``          0.22    an LR jump (a fault, or a re-warm of 1-5 steps) to 4-15x;
                            SGD also: one unclipped gradient spike of 1e3-1e5
``fragile``         0.08    fp16 without a loss scaler at 1-3x, post-LN without
                            warmup, or (AdamW) a tiny beta2 and eps, unclipped
``safe_ramp``       top-up  learn at 0.05-0.2x, re-warm over 100-300 steps to 0.3-0.8x
                            (SGD 0.15-0.4x): slow_ramp's hard negative, drawn only by
                            a focused top-up (``TOP_UP_RECIPES``)
``nanogpt``         top-up  the recipe most people train (nanoGPT / GPT-2): warmup
                            over 2-10 %, cosine to 10 %, peak 0.6-6x (0.3-3x its own
                            edge, ``NANOGPT_EDGE``), no qk-norm,
                            weight decay 0.1, clip 1.0, beta2 0.95 or 0.99 (AdamW),
                            1,500-2,500 steps of its own: healthy, or a collapse late
                            in the run with no trigger after step 0 (issue 20)
==================  ======  =========================================================

A focused top-up may also draw Muon (``TOP_UP_OPTIMIZERS``, ``--optimizers muon``; its
edge: ``MUON_EDGE``), and ``Focus(breadth=True)`` is the breadth sweep (``breadth.py``:
Muon, every part of the drawn family, nanogpt on larger models), built on ``draw_run``.

A focused top-up may also draw the ``drawn`` model family (``TOP_UP_FAMILIES``,
``--families drawn``), whose block (serial or parallel), norm (LayerNorm or RMSNorm,
pre or post), positions (learned, rotary, ALiBi, none), MLP (GELU or SwiGLU), tied head
and head count (2, 4, 8) are each drawn independently (``_architecture``) and recorded
in the config: a held-out evaluation can leave out one part rather than one family.
Its edge was measured on two pilots (2,000 steps, warmup 100; /root/cg-data/issue20/pilot)
and the first 7 runs of a sweep drawn at 0.3-3x the ramp edge itself
(/root/cg-data/issue20/nanogpt-edge1x): at 3x (serial pre-LN RMSNorm, learned positions,
2x64, the language of 128 ids) the loss hovered near 4.2 nats, then rose from step ~650
(onset 677, ``develops``, the attention one-hot, the LR decayed to 2.4x); at 0.4-1.9x
all 8 runs stayed healthy. A decaying LR is gentler than a ramp to the same peak, so the
recipe draws around an edge of its own, twice the ramp's (``NANOGPT_EDGE``).

Measured on the first 60 runs of the seed-0 sweep (1,000 steps, ``benchmarks/real_runs.py
--report-only``; "develops" = onset 50+ steps after its latest trigger, "<50" = 10-49):

==================  ====  =======  ========  ===  ======  ==============================
recipe              runs  healthy  develops  <50  sudden  notes
==================  ====  =======  ========  ===  ======  ==============================
``baseline``           4        4         0    0       0
``safe_high_lr``       6        6         0    0       0  all hard negatives held
``spike``              4        3         0    0       1  SGD + 28 random batches: sudden
``constant_high``      9        3         6    0       0  Lion collapses every time;
                                                          AdamW mostly only plateaus
``slow_ramp``         11        3         5    3       0  2 of 3 AdamW ramps to ~0.1
                                                          (2.4x) did not collapse
``growing_fault``      8        1         3    2       2  corrupt ramps: onsets 8-38
                                                          steps in (the loss counts
                                                          the random targets)
``sudden``            13        0         0    0      13  onset 1-4 steps after the jump
``fragile``            5        4         1    0       0
all                   60       24        15    5      16  40 / 25 / 8 / 27 %
==================  ====  =======  ========  ===  ======  ==============================

By optimizer, collapses that develop 50+ steps: AdamW 3 of 26 runs, Lion 9 of 19, SGD 3
of 15. SGD's measured edge is lower than the ``STABLE_EDGE`` it was drawn with (the
seed-1 pilot and run 51 here: SGD collapsed at LR 0.75-1.0, not past 1.5), so its ramps
collapse 20-30 steps in; kept, since changing it would change the draws of the running
sweep. AdamW varies most with family and data (gpt on bytes collapsed at LR 0.035 on
its way to 0.14; mha on bytes and gpt on the language, ramped to 0.1, did not): a next
sampler version would measure its edge per family and data, put SGD's at ~0.7, and
draw fewer AdamW ``constant_high`` runs (they plateau: no label).

Every recipe also draws the nuisance knobs (depth, width and context, batch size,
betas, weight decay, clipping, bf16, init scale, warmup, final LR) so that none of
them gives the answer away. Every trigger of a run (step 0, a re-warm's start, a
fault's first step) is in ``RealRunConfig.triggers()``, and the runner records how
soon the collapse followed it (``onset.py``).

Run ``i`` of a sweep depends only on ``(seed, i)``: a sweep of 10 is the first 10 runs
of a sweep of 400, which is what makes a generation resumable. ``test_real_sampler``
pins a draw, so that a change that would reshuffle sweeps on disk fails loudly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from collapse_guard.datasets.real.config import ARCHITECTURE_CHOICES, RealRunConfig

__all__ = [
    "DATA_SHARES",
    "FAMILY_SHARES",
    "MUON_EDGE",
    "NANOGPT_EDGE",
    "OPTIMIZER_SHARES",
    "RECIPES",
    "STABLE_EDGE",
    "TOP_UP_FAMILIES",
    "TOP_UP_OPTIMIZERS",
    "TOP_UP_RECIPES",
    "Focus",
    "draw_run",
    "sample_config",
]

RECIPES: dict[str, float] = {
    # healthy by design (hard negatives among them)
    "baseline": 0.08,
    "safe_high_lr": 0.10,
    "spike": 0.07,
    # collapses that develop
    "constant_high": 0.15,
    "slow_ramp": 0.17,
    "growing_fault": 0.13,
    # collapses that start within a few steps of their trigger
    "sudden": 0.22,
    # fragile set-ups: diverge near the peak LR, or only stall
    "fragile": 0.08,
}
# Recipes drawn only by a focused top-up (``Focus``): in RECIPES they would reshuffle every
# sweep already on disk. ``safe_ramp`` is slow_ramp's hard negative (issue 8: a model
# trained without it warned on a healthy Lion re-warm to half the edge as on a collapse)
TOP_UP_RECIPES: dict[str, float] = {"safe_ramp": 0.17, "nanogpt": 0.2}
FAMILY_SHARES: dict[str, float] = {"gpt": 0.34, "rope_swiglu": 0.33, "mha": 0.33}
# Families drawn only by a focused top-up, for the same reason: ``drawn`` draws each part
# of its architecture (``_architecture``)
TOP_UP_FAMILIES: dict[str, float] = {"drawn": 0.33}
OPTIMIZER_SHARES: dict[str, float] = {"adamw": 0.45, "lion": 0.30, "sgd": 0.25}
# Optimizers drawn only when chosen (``--optimizers muon``) or by the breadth sweep
TOP_UP_OPTIMIZERS: dict[str, float] = {"muon": 0.35}
DATA_SHARES: dict[str, float] = {"bytes": 0.5, "language": 0.5}

# The LR past which a model that learned at a safe LR collapses (its loss rises and
# stays up) when brought there over a ramp; recipes draw their LRs as multiples of it.
# Measured (pilots, 400-1,000 steps, 2 layers, clipping at 1.0; /root/cg-data/pilot*):
# - AdamW: a re-warm past ~0.05 collapses (gpt, the 300-run sweep of issue 3); gpt
#   ramped 0.012 -> 0.176 over 246 steps collapsed 46 steps in, at LR 0.043; rope_swiglu
#   ramped 0.01 -> 0.15 over 150 steps: onset 119 steps in. From step 0 at a constant
#   0.03-0.12 every family's attention goes one-hot by step 100 but the loss only
#   plateaus: no collapse, the plateau is the best level (gpt, rope_swiglu, mha)
# - Lion: 0.003 constant trains (all three families); 0.03 constant wanders 3.2-3.7 nats
#   without a settled rise; mha on the language re-warmed to 0.034: a recovered spike
#   only, to 0.043: onset 84 steps into the ramp; mha ramped to 0.05: onset 125 steps
#   in; gpt warmed up over 200 steps to 0.05: onset at step 168
# - SGD (Nesterov 0.9): 1.0 constant trains, slowly (4.2 nats at step 400, AdamW 2.7);
#   3 and 10 blow up the step the 30-step warmup ends (gpt)
# One edge per optimizer: the families differed by less than these steps of 1.5-3x
STABLE_EDGE: dict[tuple[str, str], float] = {
    (family, optimizer): edge
    for family in FAMILY_SHARES
    for optimizer, edge in (("adamw", 0.04), ("lion", 0.03), ("sgd", 1.5))
}
STABLE_EDGE.update(
    {("drawn", optimizer): STABLE_EDGE["gpt", optimizer] for optimizer in OPTIMIZER_SHARES}
)
# Muon (LR matched to AdamW's update RMS, ``optim.py``), measured (issue 34; drawn family
# as gpt, 2x64, bytes, clip 1.0, momentum 0.95, warmup 100; 1,000-step pilots, not kept):
# constant 0.02 and 0.06 trained (loss 1.74, 2.03 at the end); 0.2 and 0.6 collapsed
# (onsets 189 and 80, attention one-hot); learned at 0.005 then re-warmed over 200 steps
# from step 300: to 0.5, onset 323 (the LR at 0.062); to 0.15, onset 422 (at 0.093); to
# 0.08, healthy (a 0.07-nat bump, recovered); constant 0.1 on the language of 128 ids only
# plateaued (3.78 nats), as AdamW does. So 1.5x AdamW's edge: slow ramps end at
# 0.12-0.24, safe ramps at 0.018-0.048
MUON_EDGE = 0.06
STABLE_EDGE.update({(family, "muon"): MUON_EDGE for family in (*FAMILY_SHARES, "drawn")})

# (n_layer, d_model, seq_len)
_SHAPES = ((2, 64, 64), (1, 64, 64), (3, 48, 64), (2, 96, 32), (2, 32, 64), (1, 48, 32))
_SHAPE_P = (0.35, 0.15, 0.15, 0.1, 0.15, 0.1)
_BATCHES = (8, 12, 16)
_BATCH_P = (0.35, 0.4, 0.25)
_LANGUAGE_VOCABS = (64, 128, 512)  # the procedural language's sizes (bytes: 256)


def _log_uniform(rng: np.random.Generator, low: float, high: float) -> float:
    return float(math.exp(rng.uniform(math.log(low), math.log(high))))


def _choice(rng: np.random.Generator, options, p=None):
    return options[int(rng.choice(len(options), p=p))]


# A Kronecker sequence (start + index * alpha, mod 1 in each of five dimensions): the
# first n runs of a sweep hold each recipe, shape, family, optimizer and data kind in
# its share +- 1 run, where independent draws would be off by +- sqrt(n). The five
# alphas are Roberts' R_5 sequence (powers of 1/phi, phi the root of x^6 = x + 1), whose
# joint spread is also even: with square roots of primes instead, the recipe and
# optimizer streams were locked together (measured: 3 of 68 slow ramps drew SGD, 35 Lion)
_STREAMS = ("recipe", "shape", "family", "optimizer", "data")


def _r_sequence(dims: int) -> tuple[float, ...]:
    phi = 2.0
    for _ in range(60):  # Newton on x^(d+1) - x - 1: converged long before 60
        phi -= (phi ** (dims + 1) - phi - 1) / ((dims + 1) * phi**dims - 1)
    return tuple((1 / phi) ** (k + 1) % 1.0 for k in range(dims))


_ALPHAS = dict(zip(_STREAMS, _r_sequence(len(_STREAMS)), strict=True))


def _stratified(seed: int, index: int, stream: str, shares: dict | tuple, p=None):
    options, p = (tuple(shares), tuple(shares.values())) if p is None else (shares, p)
    start = np.random.default_rng([seed, 0x5EED, _STREAMS.index(stream)]).random()
    u = (start + index * _ALPHAS[stream]) % 1.0
    return options[min(int(np.searchsorted(np.cumsum(p), u, side="right")), len(options) - 1)]


def _nuisance(rng: np.random.Generator, steps: int, shape: tuple, optimizer: str) -> dict:
    """Knobs every recipe draws the same way (recipes override some)."""
    n_layer, d_model, seq_len = shape
    knobs = {
        "n_layer": n_layer,
        "d_model": d_model,
        "seq_len": seq_len,
        "batch_size": _choice(rng, _BATCHES, _BATCH_P),
        "qk_norm": bool(rng.random() < 0.5),
        "warmup_steps": int(steps * rng.uniform(0.02, 0.1)),
        "min_lr_ratio": _choice(rng, (0.1, 0.5, 1.0)),
        "grad_clip": _choice(rng, (1.0, 0.0), (0.6, 0.4)),
        "precision": _choice(rng, ("fp32", "bf16"), (0.8, 0.2)),
        # measured: 5x the 0.02 init std trained fine at LR 0.01; a knob, not a cause
        "init_scale": _log_uniform(rng, 0.5, 3.0),
    }
    if optimizer == "adamw":
        knobs["beta2"] = _choice(rng, (0.95, 0.98, 0.99))
        knobs["weight_decay"] = _choice(rng, (0.0, 0.01, 0.1))
    elif optimizer == "lion":
        # Chen et al. 2023: beta2 0.99 (0.98 for stability), weight decay 3-10x AdamW's
        knobs["beta2"] = _choice(rng, (0.98, 0.99))
        knobs["weight_decay"] = _choice(rng, (0.0, 0.1, 0.3))
    elif optimizer == "muon":  # beta1: Muon's momentum (0.95 in torch and Jordan et al.);
        # beta2 and the decoupled weight decay: AdamW's, on the embeddings and head
        knobs["beta1"] = _choice(rng, (0.9, 0.95))
        knobs["beta2"] = _choice(rng, (0.95, 0.99))
        knobs["weight_decay"] = _choice(rng, (0.0, 0.01, 0.1))
    else:  # sgd: beta1 is the momentum; weight decay is an L2 term, so kept small
        knobs["beta1"] = _choice(rng, (0.8, 0.9, 0.95))
        knobs["weight_decay"] = _choice(rng, (0.0, 1e-4, 5e-4))
    return knobs


def _mid_run(rng: np.random.Generator, steps: int) -> int:
    """A trigger step after some learning, early enough that ~300 steps of growth still fit."""
    return int(steps * rng.uniform(0.2, 0.55))


def _ramp_steps(rng: np.random.Generator) -> int:
    # 100-300 steps: the slow ramps of the issue, long against the 10-step minimum lead
    return int(rng.integers(100, 301))


def _scheduled(knobs: dict, steps: int, step: int) -> float:
    return RealRunConfig(**{**knobs, "steps": steps}).lr_at(step)


def _baseline(rng, steps, knobs, edge, ctx) -> dict:
    return {"lr": edge * _log_uniform(rng, 0.1, 0.5)}


def _safe_high_lr(rng, steps, knobs, edge, ctx) -> dict:
    """High LR made safe: qk-norm where the family has it, otherwise warmup and clipping."""
    if ctx["family"] != "mha" and ctx["optimizer"] != "sgd":
        # measured (issue 3): AdamW with qk-norm at 1.6x the edge from the start trains
        # well; Lion's sign steps grow the logits in every coordinate: kept nearer its edge
        high = 2.5 if ctx["optimizer"] == "adamw" else 1.5
        return {"qk_norm": True, "grad_clip": 1.0, "lr": edge * _log_uniform(rng, 1.0, high)}
    # mha cannot norm q and k, and SGD's failure is not the attention's: a long warmup
    # and clipping at an LR just under the edge
    return {
        "grad_clip": 1.0,
        "warmup_steps": int(steps * rng.uniform(0.15, 0.3)),
        "lr": edge * _log_uniform(rng, 0.5, 0.9),
    }


def _spike(rng, steps, knobs, edge, ctx) -> dict:
    """A fault a run recovers from: a recorded spike, a hard negative."""
    kinds = ("grad_spike", "corrupt_batch") + (
        ("opt_reset",) if ctx["optimizer"] == "adamw" else ()
    )
    kind = _choice(rng, kinds)
    drawn = {
        "lr": edge * _log_uniform(rng, 0.1, 0.4),
        "fault": kind,
        "fault_step": _mid_run(rng, steps),
    }
    if kind == "grad_spike":
        drawn["fault_scale"] = _log_uniform(rng, 1e2, 1e4)
        drawn["fault_steps"] = int(rng.integers(1, 4))
        drawn["grad_clip"] = 1.0  # SGD without clipping would take the whole spike
    elif kind == "corrupt_batch":
        drawn["fault_steps"] = int(rng.integers(1, 30))
    return drawn


def _constant_high(rng, steps, knobs, edge, ctx) -> dict:
    """A constant LR far above the edge, reached by a long warmup (as every recipe warms up).

    The model learns while the LR is low, then degrades once it passes the edge: the
    onset comes hundreds of steps after step 0, its only trigger. Measured: warmed up
    over 30 steps, AdamW at 2-4x the edge only plateaus 0.1-0.2 nats above its best
    (no collapse: kept as a high-LR negative); over 200 steps to 3x, gpt rose 0.28 nats
    (just under the label's margin) and Lion collapsed at step 168. So the warmups are
    long (200-500 steps: the LR passes the edge after 33-250 steps, once the model has
    learned) and the LRs 2-6x.
    """
    return {
        "qk_norm": False,
        "lr": edge * _log_uniform(rng, 2.0, 6.0),
        "warmup_steps": int(rng.integers(200, 501)),
        "min_lr_ratio": float(rng.uniform(0.7, 1.0)),
    }


def _slow_ramp(rng, steps, knobs, edge, ctx) -> dict:
    """Learn at a safe LR, then re-warm over 100-300 steps to 2-4x the edge.

    A ramp to k times the edge passes it about 1/k of the way up, and the onsets came
    near that point (pilots: 46 steps into a 246-step ramp to 4.4x, 84 into 199 to
    1.4x Lion's). Ending at 2-4x puts the edge 25-150 steps into the ramp, so most
    onsets come 50+ steps after their trigger.
    """
    return {
        "qk_norm": False,
        "lr": edge * _log_uniform(rng, 0.1, 0.5),
        "rewarm_step": _mid_run(rng, steps),
        "rewarm_steps": _ramp_steps(rng),
        "rewarm_lr": edge * _log_uniform(rng, 2.0, 4.0),
        # measured (600-step sweep): decaying a re-warmed 0.1 to 0.05 let the loss drift back
        "min_lr_ratio": float(rng.uniform(0.7, 1.0)),
    }


def _safe_ramp(rng, steps, knobs, edge, ctx) -> dict:
    """``slow_ramp`` that stays under the edge: learn at 0.05-0.2x, re-warm to 0.3-0.8x.

    SGD's measured edge is about half the one drawn with (module docstring), so its ramp
    ends at 0.15-0.4x. A hard negative: the LR rises as slowly as before a collapse.
    """
    sgd = ctx["optimizer"] == "sgd"
    return {
        **_slow_ramp(rng, steps, knobs, edge, ctx),
        "lr": edge * _log_uniform(rng, *((0.03, 0.1) if sgd else (0.05, 0.2))),
        "rewarm_lr": edge * _log_uniform(rng, *((0.15, 0.4) if sgd else (0.3, 0.8))),
    }


# The nanogpt recipe's own edge, in multiples of STABLE_EDGE (measured, issue 20: with
# warmup then cosine, AdamW runs at 0.4-1.9x stayed healthy (7 of 7), a pilot at 3x
# collapsed 677 steps in, after a decay to 2.4x): a decaying LR is gentler than a ramp
NANOGPT_EDGE = 2.0


def _nanogpt(rng, steps, knobs, edge, ctx) -> dict:
    """The recipe most people train (nanoGPT, GPT-2): warmup, cosine to 10 %, AdamW.

    Peak LR from 0.3x to 3x the recipe's own edge (``NANOGPT_EDGE``: 0.6-6x the ramp
    edge), no qk-norm, weight decay 0.1, clipping at 1.0, beta2 0.95 or 0.99, and
    1,500-2,500 steps of its own (the sweep's ``steps`` is not used): whatever goes
    wrong goes wrong without a trigger after step 0, late or not at all. With Lion or
    SGD it keeps that optimizer's own betas and weight decay.
    """
    own_steps = int(rng.integers(1500, 2501))
    drawn = {
        "steps": own_steps,
        "lr": NANOGPT_EDGE * edge * _log_uniform(rng, 0.3, 3.0),
        "warmup_steps": int(own_steps * rng.uniform(0.02, 0.1)),
        "min_lr_ratio": 0.1,
        "qk_norm": False,
        "grad_clip": 1.0,
    }
    if ctx["optimizer"] == "adamw":
        drawn.update(beta1=0.9, beta2=_choice(rng, (0.95, 0.99)), weight_decay=0.1)
    return drawn


def _growing_fault(rng, steps, knobs, edge, ctx) -> dict:
    """A fault that grows over 100-300 steps: a rising LR, or more and more random tokens."""
    kind = _choice(rng, ("lr_ramp", "corrupt_ramp"))
    lr = edge * _log_uniform(rng, 0.1, 0.5)
    drawn = {
        "lr": lr,
        "min_lr_ratio": 1.0,
        "fault": kind,
        "fault_step": _mid_run(rng, steps),
        "fault_steps": _ramp_steps(rng),
    }
    if kind == "lr_ramp":
        drawn["qk_norm"] = False
        # aim the ramp's end at 2-4x the edge, whatever the LR it starts from (as for
        # the slow re-warm: the edge is passed 25-150 steps into the ramp)
        scheduled = _scheduled({**knobs, **drawn}, steps, drawn["fault_step"])
        drawn["fault_scale"] = edge * _log_uniform(rng, 2.0, 4.0) / scheduled
    else:
        drawn["fault_scale"] = float(rng.uniform(0.3, 1.0))
    return drawn


def _sudden(rng, steps, knobs, edge, ctx) -> dict:
    """An LR jump (a fault, or a re-warm of 1-5 steps) far past the edge; SGD: a gradient spike."""
    kinds = ("lr_jump", "rewarm") + (("grad_spike",) if ctx["optimizer"] == "sgd" else ())
    kind = _choice(rng, kinds)
    lr = edge * _log_uniform(rng, 0.1, 0.5)
    step = _mid_run(rng, steps)
    if kind == "rewarm":
        return {
            "lr": lr,
            "rewarm_step": step,
            "rewarm_steps": int(rng.integers(1, 6)),
            "rewarm_lr": edge * _log_uniform(rng, 4.0, 15.0),
            "min_lr_ratio": float(rng.uniform(0.7, 1.0)),
        }
    drawn = {"lr": lr, "fault": kind, "fault_step": step}
    if kind == "grad_spike":  # unclipped SGD takes the whole spike as one huge step
        drawn.update(grad_clip=0.0, fault_scale=_log_uniform(rng, 1e3, 1e5), fault_steps=1)
    else:
        scheduled = _scheduled({**knobs, **drawn}, steps, step)
        drawn["fault_scale"] = edge * _log_uniform(rng, 4.0, 15.0) / scheduled
    return drawn


def _fragile(rng, steps, knobs, edge, ctx) -> dict:
    """A fragile set-up at a moderate LR: divergence near the peak LR, or only a stall."""
    mechanisms = ["fp16"]
    if ctx["family"] != "rope_swiglu":
        mechanisms.append("post_ln")
    if ctx["optimizer"] == "adamw":
        mechanisms.append("adam_eps")
    mechanism = _choice(rng, tuple(mechanisms))
    warmup = int(steps * rng.uniform(0.02, 0.4))  # divergence comes near the peak LR
    if mechanism == "post_ln":  # post-LN without warmup (Xiong et al. 2020): measured
        # (600-step sweep) it stalls ~0.6 nats above a pre-LN run rather than collapsing
        return {
            "pre_ln": False,
            "warmup_steps": int(steps * rng.uniform(0.0, 0.02)),
            "lr": edge * _log_uniform(rng, 0.2, 1.0),
        }
    if mechanism == "adam_eps":  # a jumpy second moment with nothing to bound the update
        return {
            # measured (600-step sweep): beta2 0.5 diverged at LR 0.0085 and 0.02, 0.82 did not
            "beta2": float(rng.uniform(0.5, 0.75)),
            "eps": _log_uniform(rng, 1e-12, 1e-10),
            "grad_clip": 0.0,
            "lr": edge * _log_uniform(rng, 0.06, 0.6),
            "warmup_steps": warmup,
        }
    # fp16 without a loss scaler: activations overflow to inf, the loss goes NaN
    # (measured, AdamW, gpt: at 1-1.6x the edge; at 0.5-0.9x it trained fine)
    return {
        "precision": "fp16",
        "grad_clip": 0.0,
        "lr": edge * _log_uniform(rng, 1.0, 3.0),
        "warmup_steps": warmup,
    }


_RECIPE_KNOBS = {
    "baseline": _baseline,
    "safe_high_lr": _safe_high_lr,
    "spike": _spike,
    "constant_high": _constant_high,
    "slow_ramp": _slow_ramp,
    "growing_fault": _growing_fault,
    "sudden": _sudden,
    "fragile": _fragile,
    "safe_ramp": _safe_ramp,
    "nanogpt": _nanogpt,
}

# the drawn family's parts besides ARCHITECTURE_CHOICES: norm placement and head count
_PRE_LN_P = 0.75  # post-LN is the exception in practice (and needs the warmup it gets)
_HEADS = (2, 4, 8)


def _architecture(seed: int, index: int, d_model: int) -> dict:
    """The ``drawn`` family's parts, each independent of the others and of the recipe.

    From a stream of its own (``[seed, index, 0xA2C4]``), so the recipe's knobs are
    drawn exactly as for any other family. Heads divide the width into even head dims
    (rotary positions need them): every width of ``_SHAPES`` takes all of ``_HEADS``.
    """
    rng = np.random.default_rng([seed, index, 0xA2C4])
    parts = {field: _choice(rng, choices) for field, choices in ARCHITECTURE_CHOICES.items()}
    parts["pre_ln"] = bool(rng.random() < _PRE_LN_P)
    heads = tuple(h for h in _HEADS if d_model % h == 0 and (d_model // h) % 2 == 0)
    parts["n_head"] = _choice(rng, heads)
    return parts


@dataclass(frozen=True)
class Focus:
    """A sweep narrowed to some recipes and optimizers, in their shares among themselves.

    For topping up one kind of run: measured on 388 runs of the seed-0 sweep,
    ``constant_high`` and ``slow_ramp`` with Lion or SGD developed a collapse 50+ steps
    after its trigger in 54 of 74 runs, against 102 of 388 for the whole mix. Families
    and data keep their shares. A focused sweep has its own run ids (:attr:`tag`), so it
    can share a folder with the full one. Measured, the 70 runs of that focus with seed 1:
    42 developed 50+ steps after their trigger, 20 at 10-49 steps (12 of them SGD's slow
    ramps: its edge is lower than the one drawn with, see ``STABLE_EDGE``), 8 stayed healthy.
    """

    recipes: tuple[str, ...] = ()  # empty: every recipe
    optimizers: tuple[str, ...] = ()  # empty: every optimizer
    families: tuple[str, ...] = ()  # empty: the three hand-written ones (FAMILY_SHARES)
    # the breadth sweep (``breadth.py``: its own shares, Muon, every part of the ``drawn``
    # family, nanogpt on larger models), narrowed by the fields above when they are set
    breadth: bool = False

    def __post_init__(self) -> None:
        for field, chosen, known in (
            ("recipes", self.recipes, {**RECIPES, **TOP_UP_RECIPES}),
            ("optimizers", self.optimizers, {**OPTIMIZER_SHARES, **TOP_UP_OPTIMIZERS}),
            ("families", self.families, {**FAMILY_SHARES, **TOP_UP_FAMILIES}),
        ):
            unknown = sorted(set(chosen) - set(known))
            if unknown:
                raise ValueError(
                    f"unknown {field} {', '.join(unknown)}; expected some of "
                    f"{', '.join(known)} (comma-separated)"
                )

    @property
    def tag(self) -> str:
        """``constant_high+slow_ramp.lion+sgd`` (``.drawn`` when families are chosen): part
        of the focused sweep's run ids; ``breadth`` (``breadth.muon``...) for the breadth sweep."""
        chosen = (self.recipes, self.optimizers) + ((self.families,) if self.families else ())
        tag = ".".join("+".join(names) or "all" for names in chosen)
        if not self.breadth:
            return tag
        return "breadth" if tag == "all.all" else f"breadth.{tag}"

    def shares(self, stream: str, shares: dict[str, float]) -> dict[str, float]:
        """``shares`` of a stream, narrowed to the chosen names and summing to 1 again."""
        chosen = {"recipe": self.recipes, "optimizer": self.optimizers, "family": self.families}
        chosen = chosen[stream]
        if not chosen:
            return shares  # as is: an unfocused sweep draws exactly what it always did
        total = sum(shares[k] for k in chosen)
        return {k: v / total for k, v in shares.items() if k in chosen}


def sample_config(
    seed: int, index: int, steps: int = RealRunConfig.steps, focus: Focus | None = None
) -> RealRunConfig:
    """Config of run ``index`` of the sweep drawn with ``seed`` (a function of both only,
    and of ``focus`` when the sweep is narrowed to some recipes and optimizers)."""
    focus = focus or Focus()
    if focus.breadth:
        raise ValueError(
            "the breadth sweep is drawn by collapse_guard.datasets.real.sample_config "
            "(sweeps.py), not by the sampler's; call that one"
        )
    rng = np.random.default_rng([seed, index])
    # top-up recipes only when chosen: an unfocused sweep draws exactly what it always did
    recipes = {**RECIPES, **TOP_UP_RECIPES} if focus.recipes else RECIPES
    families = {**FAMILY_SHARES, **TOP_UP_FAMILIES} if focus.families else FAMILY_SHARES
    optimizers = {**OPTIMIZER_SHARES, **TOP_UP_OPTIMIZERS} if focus.optimizers else OPTIMIZER_SHARES
    recipe = _stratified(seed, index, "recipe", focus.shares("recipe", recipes))
    ctx = {
        "family": _stratified(seed, index, "family", focus.shares("family", families)),
        "optimizer": _stratified(seed, index, "optimizer", focus.shares("optimizer", optimizers)),
        "data": _stratified(seed, index, "data", DATA_SHARES),
    }
    shape = _stratified(seed, index, "shape", _SHAPES, _SHAPE_P)
    return draw_run(
        rng, steps, recipe, ctx, shape, lambda d_model: _architecture(seed, index, d_model)
    )


def draw_run(
    rng: np.random.Generator,
    steps: int,
    recipe: str,
    ctx: dict,
    shape: tuple,
    architecture: Callable[[int], dict],
) -> RealRunConfig:
    """The config of one run whose recipe, family, optimizer, data and shape are drawn:
    its knobs from ``rng``, then ``architecture(d_model)``'s parts for the drawn family."""
    knobs = _nuisance(rng, steps, shape, ctx["optimizer"])
    if ctx["family"] == "mha":
        knobs["qk_norm"] = False  # nn.MultiheadAttention has no place for it
    vocab = _choice(rng, _LANGUAGE_VOCABS) if ctx["data"] == "language" else 256
    edge = STABLE_EDGE[ctx["family"], ctx["optimizer"]]
    knobs.update(_RECIPE_KNOBS[recipe](rng, steps, {**knobs, **ctx}, edge, ctx))
    if ctx["family"] == "mha":
        knobs["qk_norm"] = False
    run_seed = int(rng.integers(2**31))
    if ctx["family"] == "drawn":
        knobs.update(architecture(knobs["d_model"]))
    # a recipe may run for steps of its own (nanogpt)
    knobs = {"steps": steps, **knobs}
    return RealRunConfig(recipe=recipe, seed=run_seed, vocab_size=vocab, **ctx, **knobs)
