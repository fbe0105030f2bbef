"""The forecast's actions on a real tiny model, the risk stubbed (the risk is not what these
tests are about: ``FixedRisk`` answers the level a test sets, read at the next step):
warn holds the LR (``warn_action="hold"``, the default) while the loop's schedule rises,
and releases it after; ``forecast_actions=False`` leaves the LR and clipping alone at any
level, and the reactive rescue still comes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from guard_helpers import Loop, tiny_model

from collapse_guard.guard import Guard, GuardPolicy
from collapse_guard.guard.trackers import guard_metrics

RISE = 1.05  # the loop's LR rises 5 % a step: a ramp, never a jump (lr_jump_ratio 2)


def _ramp(tmp_path, fixed_risk, levels: dict[int, str], steps: int, **policy) -> tuple:
    """Train ``steps`` steps with the loop's LR 1e-3 x RISE^step and the risk switched to
    ``levels[s]`` after step s (the reading of step s + 1, in force from step s + 2); the
    loop's LRs, the LRs in force and the guard."""
    model, opt = tiny_model()
    risk = fixed_risk("ok")
    quiet = {"outlier_z": 1e9, "critical_outlier_z": 1e9}  # no skips: every step updates
    guard = Guard(model, opt, tmp_path, risk=risk, policy={"risk_every": 1, **quiet, **policy})
    loop, loop_lrs, in_force = Loop(), [], []
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = 1e-3 * RISE**step
        loop_lrs.append(opt.param_groups[0]["lr"])
        assert guard.step(loop.loss(model)).apply_update
        in_force.append(guard.lr_in_force)
        opt.zero_grad()
        risk.fixed = levels.get(step, risk.fixed)
    guard.close()
    return loop_lrs, in_force, guard


def test_warn_holds_the_lr_while_the_schedule_rises_and_releases_it_after(tmp_path, fixed_risk):
    levels = {8: "warn", 18: "ok"}  # steps 10-19 at warn; released from step 20
    loop_lrs, in_force, guard = _ramp(tmp_path, fixed_risk, levels, 40, lr_restore_steps=5)
    assert in_force[:10] == pytest.approx(loop_lrs[:10])  # below warn: the loop's own LR
    held = loop_lrs[10]  # the LR in force at the warn's first step
    assert in_force[10:20] == pytest.approx([held] * 10)  # not cut, and no higher
    assert loop_lrs[19] > 1.5 * held  # ... while the schedule went on rising
    # released by doubling every 5 steps (2^0.2 = 1.149 a step, over the schedule's 1.05)
    released = [held * 2 ** ((t - 19) / 5) for t in range(20, 40)]
    expected = [min(r, lr) for r, lr in zip(released, loop_lrs[20:], strict=True)]
    assert in_force[20:] == pytest.approx(expected)
    assert in_force[-1] == pytest.approx(loop_lrs[-1])  # the hold is gone
    events = [e for _, e in guard.events if e.startswith("lr_hold")]
    assert events == [f"lr_hold:{held:.3g}", "lr_hold:off"]
    assert guard.summary()["lr_holds"] == 1 and guard.summary()["lr_hold"] == math.inf


def test_a_held_run_keeps_the_watch_cadence_of_checkpoints_after_the_risk_falls(
    tmp_path, fixed_risk
):
    # the risk falls because the hold stopped the LR's rise, not because the collapse went
    # away: a rollback from a rescue must not reach back past the hold (issue 32)
    levels, cadence = {8: "warn", 18: "ok"}, {"checkpoint_every": 1000, "watch_checkpoint_gap": 5}
    runs = {
        name: _ramp(tmp_path / name, fixed_risk, levels, 50, lr_restore_steps=restore, **cadence)[2]
        for name, restore in (("held", 1000), ("released", 1))
    }
    late = {
        name: [s for s, e in g.events if e == "checkpoint" and s >= 25] for name, g in runs.items()
    }
    assert runs["held"].summary()["lr_hold"] < math.inf  # held to the end, the risk at ok
    assert len(late["held"]) >= 4 and set(np.diff(late["held"])) == {5}
    assert runs["released"].summary()["lr_hold"] == math.inf and late["released"] == []


@pytest.mark.parametrize("warn_fall", [0.25, 0.0])
def test_a_loss_that_rises_under_the_hold_caps_the_lr_for_good_when_asked(
    tmp_path, fixed_risk, warn_fall
):
    # the hold stopped the rise and the loss rises still: the run cannot absorb the LR it
    # holds. warn_fall caps it as a rescue would, with nothing rolled back (warn_rescue,
    # the default, would rescue it first: test_rewind.py)
    model, opt = tiny_model()
    risk = fixed_risk("ok")
    quiet = {"outlier_z": 1e9, "critical_outlier_z": 1e9}  # the rise is no outlier skip
    policy = {"risk_every": 1, "warn_fall": warn_fall, "warn_rescue": False, **quiet}
    guard, loop, in_force = Guard(model, opt, tmp_path, risk=risk, policy=policy), Loop(), []
    for step in range(90):
        for group in opt.param_groups:
            group["lr"] = 1e-3 * RISE**step
        lifted = 1.0 if step >= 70 else 0.0  # a nat over the loss from step 70, held since 10
        assert guard.step(loop.loss(model) + lifted).apply_update
        in_force.append(guard.lr_in_force)
        opt.zero_grad()
        risk.fixed = "warn" if step == 8 else risk.fixed
    guard.close()
    held = 1e-3 * RISE**10
    caps = [(s, e) for s, e in guard.events if e.startswith("lr_ceiling:")]
    if not warn_fall:
        assert caps == [] and in_force[-1] == pytest.approx(held)
        return
    ((at, event),) = caps  # once: the cap does not fall again on the same precursor
    assert 70 <= at < 80 and event == f"lr_ceiling:{warn_fall * held:.3g}"
    assert in_force[at + 1 :] == pytest.approx([warn_fall * held] * (89 - at))
    assert guard.rescues == 0 and guard.skipped == 0  # nothing undone


@pytest.mark.parametrize("release", ["watch", "warn"])
def test_a_risk_between_watch_and_warn_keeps_the_hold_unless_told(tmp_path, fixed_risk, release):
    levels = {8: "warn", 18: "watch", 28: "ok"}  # warn 10-19, watch 20-29, ok from 30
    loop_lrs, in_force, _ = _ramp(
        tmp_path, fixed_risk, levels, 40, lr_restore_steps=5, hold_release=release
    )
    held = loop_lrs[10]
    first = 30 if release == "watch" else 20  # the first step whose ceiling rises
    assert in_force[10:first] == pytest.approx([held] * (first - 10))
    assert in_force[first] == pytest.approx(held * 2**0.2)
    assert in_force[first] < loop_lrs[first]  # still held, now released step by step


def test_a_resumed_run_stays_held_and_the_trackers_lr_scale_shows_the_hold(tmp_path, fixed_risk):
    loop_lrs, in_force, guard = _ramp(tmp_path, fixed_risk, {8: "warn"}, 20, warn_action="hold")
    held = loop_lrs[10]
    assert in_force[-1] == pytest.approx(held)
    # the loop's LR is 1.05^9 = 1.55x the held one: the tracker's factor is the hold's
    assert guard_metrics(guard)["guard/lr_scale"] == pytest.approx(held / loop_lrs[-1])
    torch.save(guard.state_dict(), tmp_path / "state.pt")
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    policy = {"risk_every": 1, "warn_action": "hold", "outlier_z": 1e9}
    model, opt = tiny_model()

    def first_step_lr(state, folder) -> float:
        back = Guard(model, opt, folder, risk=fixed_risk("warn"), policy=policy)
        back.load_state_dict(state)
        for group in opt.param_groups:
            group["lr"] = 2 * loop_lrs[-1]
        back.step(Loop().loss(model))
        opt.zero_grad()
        back.close()
        return back.lr_in_force

    assert first_step_lr(state, tmp_path / "b") == pytest.approx(held)  # held on at resume
    del state["run"]["lr_hold"]  # a checkpoint saved before the hold was kept: it loads
    assert first_step_lr(state, tmp_path / "c") == pytest.approx(2 * loop_lrs[-1])


def test_warn_scales_the_lr_when_asked(tmp_path, fixed_risk):
    loop_lrs, in_force, guard = _ramp(tmp_path, fixed_risk, {8: "warn"}, 15, warn_action="scale")
    assert in_force[10:] == pytest.approx([0.5 * lr for lr in loop_lrs[10:]])
    assert guard.summary()["lr_holds"] == 0


def _grad_norm(model) -> float:
    return torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])).item()


def test_reactive_only_leaves_lr_and_clip_alone_and_still_rescues(tmp_path, fixed_risk):
    loop_lrs, in_force, _ = _ramp(tmp_path, fixed_risk, {3: "critical"}, 12, forecast_actions=False)
    assert in_force == pytest.approx(loop_lrs)  # critical from step 5: no cut
    model, opt = tiny_model()
    policy = GuardPolicy(risk_every=1, forecast_actions=False, max_skip_streak=1)
    guard = Guard(model, opt, tmp_path / "r", risk=fixed_risk("critical"), policy=policy)
    loop = Loop()
    for _ in range(12):
        guard.step(loop.loss(model))
        opt.zero_grad()
    assert guard.level.value == "critical"
    loss = loop.loss(model)
    scale = 4.0 / _grad_norm(model)  # a norm of 4: over every bound (under 20 steps of
    for p in model.parameters():  # history: no outlier rule yet)
        p.grad.mul_(scale)
    decision = guard.step(loss)
    assert decision.clip_to == 1.0 and decision.lr_multiplier == 1.0  # not critical's 0.25
    assert _grad_norm(model) == pytest.approx(1.0, rel=1e-4)
    opt.zero_grad()
    loop.loss(model)
    assert guard.step(torch.tensor(math.nan)).rescue  # the reactive path is all there
    assert guard.rescues == 1 and guard.lr_ceiling < math.inf
    guard.close()


def test_the_forecast_knobs_reject_bad_values():
    with pytest.raises(ValueError, match="warn_action must be one of"):
        GuardPolicy(warn_action="freeze")
    with pytest.raises(ValueError, match="hold_release must be one of"):
        GuardPolicy(hold_release="ok")
    with pytest.raises(TypeError, match="forecast_actions must be True or False"):
        GuardPolicy(forecast_actions=1)
    with pytest.raises(ValueError, match=r"warn_fall is an LR factor in \(0, 1\] \(0: off\)"):
        GuardPolicy(warn_fall=1.5)
    with pytest.raises(ValueError, match="warn_fall must be finite and >= 0"):
        GuardPolicy(warn_fall=-0.25)
