"""The rescue's cap after an LR jump (issue 32): the checkpoint's LR predates the jump
(``jump_rescue_lr``), and a cap that follows the loop's schedule down
(``cap_follows_schedule``) keeps the run's anneal where a cap that stood still lost it."""

from __future__ import annotations

import math
import warnings
from collections import deque

import pytest
from guard_helpers import Loop, tiny_model

from collapse_guard.guard import Guard, GuardPolicy
from collapse_guard.guard.decision import GuardDecision
from collapse_guard.guard.rescue import lift_cap
from collapse_guard.guard.state import RunState
from collapse_guard.predictor.core.levels import OK


def _capped(cap: float, anchor: float, loop_lr: float) -> RunState:
    run = RunState.fresh(GuardPolicy())
    run.lr_ceiling, run.lr_anchor = cap, anchor
    run.loop_lrs = deque([loop_lr])
    return run


def test_the_cap_falls_with_the_loops_lr_under_its_anchor_and_never_rises_over_itself():
    assert _capped(1e-3, 0.3, 0.3).lr_cap() == pytest.approx(1e-3)
    assert _capped(1e-3, 0.3, 0.03).lr_cap() == pytest.approx(1e-4)  # a tenth of the LR
    assert _capped(1e-3, 0.3, 3.0).lr_cap() == pytest.approx(1e-3)  # a re-warm stays capped
    assert _capped(1e-3, math.inf, 0.03).lr_cap() == 1e-3  # a cap that stands still
    assert RunState.fresh(GuardPolicy()).lr_cap() == math.inf  # no cap, no loop LR yet
    assert _capped(math.inf, 0.3, 0.0).lr_cap() == math.inf  # a lifted-off cap, the LR at 0


def _jumped(tmp_path, policy: GuardPolicy) -> tuple[Guard, list[float]]:
    """A tiny model at 3e-3 for 60 steps, then 100x and a decay to a tenth by step 160 (a
    jumped LR x its schedule, the sampler's sudden recipe): the guard and its LR in force
    by step from the jump on."""
    model, opt = tiny_model()
    loop, guard = Loop(), Guard(model, opt, tmp_path, risk="off", record=False, policy=policy)
    in_force = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in range(160):
            decay = 1.0 if step < 60 else 1.0 - 0.9 * (step - 60) / 100
            for group in opt.param_groups:
                group["lr"] = 3e-3 * (1.0 if step < 60 else 100.0 * decay)
            guard.step(loop.loss(model))
            opt.zero_grad()
            in_force.append(guard.lr_in_force)
    guard.close()
    return guard, in_force


@pytest.mark.parametrize("factor", [0.5, 1.0])
def test_a_jumps_rescue_caps_at_jump_rescue_lr_times_the_checkpoints_lr(tmp_path, factor):
    policy = GuardPolicy(jump_rescue_lr=factor, cap_follows_schedule=False)  # it stands still
    guard, in_force = _jumped(tmp_path, policy)
    rescues = [e for _, e in guard.events if e.startswith("rescue:")]
    assert len(rescues) == 1 and rescues[0].startswith("rescue:lr_jump"), guard.events
    assert guard.lr_ceiling == pytest.approx(factor * 3e-3)  # the checkpoint's LR: 3e-3
    assert in_force[-1] == pytest.approx(factor * 3e-3)  # the loop's 0.03 stays capped


def test_by_default_the_jumped_run_anneals_under_its_cap(tmp_path):
    guard, in_force = _jumped(tmp_path, GuardPolicy())  # 1x the checkpoint's LR, following
    (rescue,) = [s for s, e in guard.events if e.startswith("rescue:")]
    anchor = 0.3 * (1.0 - 0.9 * (rescue - 60) / 100)  # the loop's LR at the rescue
    assert guard.run.lr_anchor == pytest.approx(anchor)
    # the loop's LR fell from the anchor to 0.3 x 0.109: the cap fell in proportion
    assert in_force[-1] == pytest.approx(3e-3 * 0.3 * 0.109 / anchor)
    assert in_force[-1] < 0.25 * 3e-3  # a cap that stood still would be 3e-3 here
    # the summary (and the run file's) gives the cap as it stands; the attribute, as set
    assert guard.summary()["lr_ceiling"] == pytest.approx(in_force[-1])
    assert guard.lr_ceiling == pytest.approx(3e-3)


def test_a_cap_set_at_a_loop_lr_of_zero_stands_still(tmp_path):
    model, opt = tiny_model()
    loop, guard = Loop(), Guard(model, opt, tmp_path, risk="off", record=False)
    for step in range(40):  # a checkpoint at the first step; a rescue forced at an LR of 0
        for group in opt.param_groups:
            group["lr"] = 0.0 if step == 30 else 3e-3
        if step == 30:
            guard.force_next("rescue")
        guard.step(loop.loss(model))
        opt.zero_grad()
    guard.close()
    assert guard.run.lr_anchor == math.inf and guard.lr_ceiling == pytest.approx(1.5e-3)
    assert guard.lr_in_force == pytest.approx(1.5e-3)  # under the loop's 3e-3, no division


def test_a_lifting_caps_fall_is_lr_fall_times_the_lr_in_force_under_a_fallen_schedule():
    # risen to 2e-3 over a rescue's 2e-4, set at a loop LR of 0.3 that fell to 0.15: in force 1e-3
    run = _capped(2e-3, 0.3, 0.15)
    run.lr_floor = 2e-4
    decision = GuardDecision(step=0, level=OK, apply_update=True)
    policy = GuardPolicy(lr_lift_steps=20)  # lr_fall 0.5
    events = lift_cap(decision, run, True, (0.15, run.lr_cap()), policy)  # a precursor
    assert events == ["lr_fall:0.001@0.002"]  # LRs at the anchor, as the cap's are
    assert run.lr_cap() == pytest.approx(0.5 * 1e-3)  # not 0.25: the fall counts the ratio once
    assert run.lr_edge == pytest.approx(2e-3)
    run.loop_lrs.append(0.3)  # the schedule back at the anchor: the edge and cap stand
    assert run.lr_cap() == pytest.approx(1e-3)


def test_the_new_knobs_are_checked():
    with pytest.raises(ValueError, match="jump_rescue_lr"):
        GuardPolicy(jump_rescue_lr=1.5)
    with pytest.raises(TypeError, match="cap_follows_schedule"):
        GuardPolicy(cap_follows_schedule=1)
