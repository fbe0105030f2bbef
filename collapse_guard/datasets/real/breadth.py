"""The breadth sweep: data where users are (issue 34, item 2).

``collapse-guard data real --sweep breadth`` (``Focus(breadth=True)``, run ids
``real-s<S>-breadth-<i>``) draws, for run ``i`` of seed ``s``:

* the ``drawn`` family with **every part drawn independently**: block, norm, positions,
  MLP, tied head, norm placement and heads as the ``drawn`` top-ups draw them
  (``sampler._architecture``), and two parts of its own, from a stream of their own:
  the **attention** variant (``config.ATTENTIONS``: multi-head, grouped-query,
  multi-query) and **qk-norm**, which here overrides the recipe's choice (in the other
  sweeps collapse recipes turn it off and ``safe_high_lr`` on): a recipe names an LR
  schedule, the label says whether the run absorbed it;
* an **optimizer** among AdamW, **Muon** (``optim.MuonAdamW``), Lion and SGD
  (``OPTIMIZER_SHARES``);
* a **recipe** among all of the sampler's, the top-ups' included (``RECIPE_SHARES``);
  ``nanogpt`` runs on **larger models** (``LARGE_SHAPES``: 4-6 layers, width 128-192,
  batch 8) for 0.6 of its own 1,500-2,500 steps, the most a core trains in ~3 minutes.

Run ``i`` depends only on ``(seed, i)`` and the focus, as in every sweep; the other
sweeps' draws are untouched (``test_real_breadth`` pins both).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from collapse_guard.datasets.real.config import ATTENTIONS, RealRunConfig
from collapse_guard.datasets.real.sampler import (
    _SHAPE_P,
    _SHAPES,
    DATA_SHARES,
    FAMILY_SHARES,
    RECIPES,
    TOP_UP_FAMILIES,
    TOP_UP_RECIPES,
    Focus,
    _architecture,
    _choice,
    _stratified,
    draw_run,
)

__all__ = [
    "LARGE_BATCH",
    "LARGE_SHAPES",
    "LARGE_STEP_SHARE",
    "OPTIMIZER_SHARES",
    "RECIPE_SHARES",
    "sample_breadth_config",
]

OPTIMIZER_SHARES: dict[str, float] = {"adamw": 0.35, "muon": 0.35, "lion": 0.15, "sgd": 0.15}
# every recipe; fewer sudden ones (the guard's reactive path owns them), more of the LR
# rises a run may or may not absorb (slow_ramp, safe_ramp, nanogpt)
RECIPE_SHARES: dict[str, float] = {
    "baseline": 0.06,
    "safe_high_lr": 0.08,
    "spike": 0.06,
    "constant_high": 0.12,
    "slow_ramp": 0.16,
    "safe_ramp": 0.10,
    "growing_fault": 0.10,
    "sudden": 0.10,
    "fragile": 0.05,
    "nanogpt": 0.17,
}
assert set(RECIPE_SHARES) == {*RECIPES, *TOP_UP_RECIPES}

# (n_layer, d_model, seq_len) of the nanogpt runs, at LARGE_BATCH sequences a step.
# Measured with the probe on one core of the loaded 2-core machine (load average ~11),
# batch 8: 4x128x64 121 ms a step, 6x128x64 177, 5x160x64 225, 4x256x64 273, 6x256x64 528
# (2x64x64 at batch 16: 65 ms, as in the seed-0 sweep's run files); so width 256 would
# allow 600-300 steps in 3 minutes, too few for a late collapse. Against 4x128x64, at
# load ~9: 6x128x32 0.94x, 4x192x32 1.06x, 5x128x64 1.25x (~150 ms: 900-1,500 steps in
# 2.3-3.8 minutes)
LARGE_SHAPES = ((4, 128, 64), (5, 128, 64), (6, 128, 32), (4, 192, 32))
_LARGE_P = (0.35, 0.25, 0.2, 0.2)
LARGE_BATCH = 8
LARGE_STEP_SHARE = 0.6  # of the recipe's 1,500-2,500 steps: 900-1,500, ~3 min at most


def _parts(seed: int, index: int, d_model: int) -> dict:
    """Every part of the drawn family: the top-ups' parts, then attention and qk-norm."""
    parts = _architecture(seed, index, d_model)
    rng = np.random.default_rng([seed, index, 0xB7EAD])
    parts["attention"] = _choice(rng, ATTENTIONS)
    parts["qk_norm"] = bool(rng.random() < 0.5)
    return parts


def sample_breadth_config(seed: int, index: int, steps: int, focus: Focus) -> RealRunConfig:
    """Config of run ``index`` of the breadth sweep drawn with ``seed`` (and ``focus``)."""
    rng = np.random.default_rng([seed, index, 0xB4EAD])
    recipe = _stratified(seed, index, "recipe", focus.shares("recipe", RECIPE_SHARES))
    families = focus.shares("family", {**FAMILY_SHARES, **TOP_UP_FAMILIES})
    ctx = {
        "family": _stratified(seed, index, "family", families) if focus.families else "drawn",
        "optimizer": _stratified(
            seed, index, "optimizer", focus.shares("optimizer", OPTIMIZER_SHARES)
        ),
        "data": _stratified(seed, index, "data", DATA_SHARES),
    }
    large = recipe == "nanogpt"
    shape = _stratified(
        seed, index, "shape", *((LARGE_SHAPES, _LARGE_P) if large else (_SHAPES, _SHAPE_P))
    )
    config = draw_run(rng, steps, recipe, ctx, shape, lambda d: _parts(seed, index, d))
    if not large:
        return config
    return replace(
        config,
        batch_size=LARGE_BATCH,
        steps=round(config.steps * LARGE_STEP_SHARE),
        warmup_steps=round(config.warmup_steps * LARGE_STEP_SHARE),
    )
