"""A stall under the warn's hold (``GuardPolicy.warn_stall_steps``, warn_hold.HoldStall): a
run held at warn whose smoothed loss gains under ``warn_stall_gain`` nats in a stretch of
held steps is rescued as a developed collapse (reason ``warn_stall``), only while the hold
stops a rise of the loop's LR. A real tiny model, the risk stubbed at warn (``FixedRisk``):
the risk is not what these tests are about."""

from __future__ import annotations

import math

import pytest
from guard_helpers import Loop, tiny_model

from collapse_guard.guard import Guard, GuardPolicy
from collapse_guard.guard.warn_hold import HoldStall

POLICY = GuardPolicy(warn_stall_steps=100, warn_stall_gain=0.02)


def _stalls(losses: list[float], policy: GuardPolicy = POLICY) -> list[int]:
    stall = HoldStall()
    return [step for step, loss in enumerate(losses) if stall.update(step, loss, policy)]


def test_a_stretch_without_its_gain_is_a_stall_and_the_next_stretch_starts_there():
    flat = [3.0] * 350
    assert _stalls(flat) == [100, 200, 300]
    # 0.03 nats a stretch (over the 0.02 asked): never; 0.01: at every stretch's end
    assert _stalls([3.0 - 0.0003 * s for s in range(350)]) == []
    assert _stalls([3.0 - 0.0001 * s for s in range(350)]) == [100, 200, 300]
    # a step without a hold (NaN) ends the stretch: the count starts over after it
    assert _stalls([3.0] * 80 + [math.nan] + [3.0] * 150) == [181]
    assert _stalls(flat, GuardPolicy(warn_stall_steps=0)) == []


def _held_run(tmp_path, fixed_risk, lr_at, steps: int, **policy) -> tuple[Guard, list[float]]:
    """``steps`` steps of a tiny GPT at the loop's LR ``lr_at(step)``, the risk at warn from
    the first reading (the hold on from step 1); the guard and the LRs in force."""
    model, optimizer = tiny_model(seed=0)
    loop, in_force = Loop(seed=0), []
    # restart_window off: a rescue in the loop's first rise would restart (test_restart.py)
    settings = {"risk_every": 1, "qk_clip": "off", "restart_window": 0, **policy}
    guard = Guard(model, optimizer, tmp_path, risk=fixed_risk("warn"), policy=settings)
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        guard.step(loop.loss(model))
        in_force.append(guard.lr_in_force)
        optimizer.zero_grad()
    guard.close()
    return guard, in_force


def _rising(step: int) -> float:  # far too small an LR to train: the loss stands still
    return 1e-7 * 1.01**step


def test_a_run_that_trains_no_further_under_a_binding_hold_is_rescued(tmp_path, fixed_risk):
    guard, in_force = _held_run(tmp_path, fixed_risk, _rising, 130)
    rescues = [(s, e) for s, e in guard.events if e.startswith("rescue:")]
    # held from step 1 (the warn's first step), binding from 2 (the loop's LR rose past it)
    assert rescues == [(102, "rescue:warn_stall")]  # 100 steps into the stretch
    events = dict((e.split(":")[0], e) for s, e in guard.events if s == 102)
    assert events["rollback"].startswith("rollback:avg")
    assert in_force[1:102] == pytest.approx([_rising(1)] * 101)  # held from the warn's first step
    cut = GuardPolicy().developed_rescue_lr * in_force[1]
    assert float(events["lr_ceiling"].split(":")[1]) == pytest.approx(cut, rel=0.01)
    assert in_force[103:] == pytest.approx([cut] * len(in_force[103:]))  # the cap stands


def test_without_the_rule_the_held_run_is_not_rescued(tmp_path, fixed_risk):
    guard, _ = _held_run(tmp_path, fixed_risk, _rising, 130, warn_stall_steps=0)
    assert not any(e.startswith("rescue:") for _, e in guard.events)


def test_a_hold_that_stops_no_rise_leaves_a_flat_loss_alone(tmp_path, fixed_risk):
    # the loop's LR decays under the held one: the hold binds nothing, the LR in force is
    # the user's own, and a loss that stands still there is no stall of the hold's making
    guard, _ = _held_run(tmp_path, fixed_risk, lambda s: 1e-7 * 0.99**s, 130)
    assert any(e.startswith("lr_hold:") for _, e in guard.events)  # held, binding nothing
    assert not any(e.startswith("rescue:") for _, e in guard.events)


def test_a_held_run_that_still_learns_is_not_rescued(tmp_path, fixed_risk):
    # 130 steps: the first stretch (binding from step 2) ends at 102 and is judged
    guard, _ = _held_run(tmp_path, fixed_risk, lambda s: 3e-3 * 1.01**s, 130)
    assert any(e.startswith("lr_hold:") for _, e in guard.events)
    assert not any(e.startswith("rescue:") for _, e in guard.events)
