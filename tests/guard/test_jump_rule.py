"""A jump is a jump (issue 32): the LR-jump rule reads the schedule the loop set, and a
step change is one where a smooth rise (a warmup, a user's ramp) is not."""

from __future__ import annotations

import math
import warnings
from collections import deque

import pytest
from guard_helpers import Loop, tiny_model

from collapse_guard.guard import Guard, GuardPolicy
from collapse_guard.guard.reactive import lr_jumped

POLICY = GuardPolicy()  # a rise over 2x between consecutive steps, remembered 10 steps
BEFORE = GuardPolicy(lr_jump_span=10)  # about the rule before: 2x within 10 steps


def _jump_steps(schedule: list[float], policy: GuardPolicy = POLICY) -> list[int]:
    """The steps at which the rule sees a jump, the LRs fed as the guard feeds them."""
    lrs: deque[float] = deque(maxlen=2 * policy.lr_jump_steps)
    steps = []
    for step, lr in enumerate(schedule):
        lrs.append(lr)
        if lr_jumped(lrs, policy):
            steps.append(step)
    return steps


def _ramp(top: float, geometric: bool = False) -> list[float]:
    """1e-3 for 200 steps, then 1x to ``top`` x over 300 steps (the newcomer's), held."""
    ramp = [min(1.0, (k + 1) / 300) for k in range(400)]
    factor = [top**r if geometric else 1 + (top - 1) * r for r in ramp]
    return [1e-3] * 200 + [1e-3 * f for f in factor]


def test_smooth_rises_are_no_jump():
    warmup = [1e-3 * min(1.0, (s + 1) / 100) for s in range(300)]
    assert [s for s in _jump_steps(warmup) if s >= 20] == []  # the outlier rule starts at 20
    assert _jump_steps(_ramp(30)) == _jump_steps(_ramp(100)) == []  # 1.33x a step at most
    assert _jump_steps(_ramp(1000, geometric=True)) == []  # 1.023x a step
    cosine = [1e-3 * (1 + math.cos(math.pi * s / 500)) / 2 + 1e-5 for s in range(500)]
    assert _jump_steps(cosine) == []


def test_a_step_change_is_a_jump_for_lr_jump_steps_steps():
    jump = [1e-3] * 50 + [1e-2] * 50
    assert _jump_steps(jump) == list(range(50, 60))
    # the sampler's mildest sudden recipe: a 1-5 step re-warm from 0.5 to 4x the edge
    rewarm = [0.5] * 50 + [0.5 + 3.5 * (k + 1) / 5 for k in range(5)] + [4.0] * 20
    assert _jump_steps(rewarm) == list(range(50, 60))


def test_a_linear_ramp_to_1000x_starts_with_a_step_change():
    # its first step is 4.33x (1 -> 1 + 999/300): as steep as a sudden recipe's re-warm
    assert _jump_steps(_ramp(1000)) == list(range(200, 210))


def test_the_rule_before_took_a_fast_ramp_for_a_jump():
    # 2x within 10 steps: from the ramp's 4th step (1.33x the base) for 22 steps
    assert _jump_steps(_ramp(100), BEFORE) == list(range(203, 225))
    assert _jump_steps(_ramp(30), BEFORE) == []


def test_lr_jump_span_must_fit_in_lr_jump_steps():
    with pytest.raises(ValueError, match="lr_jump_span"):
        GuardPolicy(lr_jump_span=11)


def _guarded(tmp_path, factor) -> list[str]:
    """A tiny model at 3e-3 for 60 steps, then ``factor(step)`` x, 120 steps: its events."""
    model, opt = tiny_model()
    loop, guard = Loop(), Guard(model, opt, tmp_path, risk="off", record=False)
    for step in range(120):
        for group in opt.param_groups:
            group["lr"] = 3e-3 * (1.0 if step < 60 else factor(step))
        guard.step(loop.loss(model))
        opt.zero_grad()
    guard.close()
    return [e for _, e in guard.events if not e.startswith("checkpoint")]


def test_a_real_step_change_is_rescued_and_a_real_ramp_is_not(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        jumped = _guarded(tmp_path / "jump", lambda step: 100.0)
        ramped = _guarded(tmp_path / "ramp", lambda step: 1 + 99 * (step - 59) / 300)
    # the step change: two gradient-norm outliers skipped, the third rescued as a jump's
    kinds = [e.split("=")[0] for e in jumped[:3]]
    assert kinds == ["skip:grad_z", "skip:grad_z", "rescue:lr_jump:grad_z"]
    assert ramped == []  # the same model ramped to 20x in those 60 steps: nothing to do


@pytest.mark.slow
@pytest.mark.parametrize("scale", [30.0, 100.0])
def test_the_newcomers_ramps_train_without_a_rescue(tmp_path, risk_model, scale):
    """The nanoGPT-style GPT (2 layers, d96, AdamW 1e-3) ramped to 30x or 100x over 300
    steps: the unguarded run survives both (benchmarks/ramp_rescues.py); the guard must not
    rescue (before issue 32 it rescued the 100x ramp at step 209 and capped it at 5e-4).
    About 2 minutes each on the loaded 2-core machine."""
    import importlib.util
    from pathlib import Path

    from collapse_guard.demo import run_scenario

    path = Path(__file__).parents[2] / "benchmarks" / "ramp_rescues.py"
    spec = importlib.util.spec_from_file_location("ramp_rescues", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = run_scenario(bench.newcomer_config(scale), risk_model, True, tmp_path)
    assert not run.gave_up and run.actions()["rescue"] == 0
    assert run.onset is None
