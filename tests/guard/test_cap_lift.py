"""The rescues' LR cap gives the run its LR back (issue 32): it rises over healthy
stretches back to the schedule, falls at a warn or an open loss excursion, remembers the
edge, and all of it survives a checkpoint."""

from __future__ import annotations

import math

import pytest
import torch
from guard_helpers import Loop, tiny_model

from collapse_guard.guard import Guard, GuardPolicy
from collapse_guard.guard.decision import GuardDecision
from collapse_guard.guard.reactive import OnlineLabel, OutlierHistory
from collapse_guard.guard.rescue import lift_cap, precursor
from collapse_guard.guard.state import RunState
from collapse_guard.predictor.core.levels import OK, WARN

POLICY = GuardPolicy(lr_lift_steps=20)  # lr_lift 1.5, lr_fall 0.5, lr_edge_share 0.7 (defaults)


def _capped(cap: float = 1e-3, edge: float = math.inf) -> RunState:
    """A run state just after a rescue capped its LR at ``cap``."""
    run = RunState.fresh(POLICY)
    run.lr_ceiling = run.lr_floor = cap
    run.lr_edge = edge
    return run


def _steps(run, n, loop_lr=1.0, level=OK, excursion=False, applied=True, policy=POLICY):
    """``n`` steps' events; the LR in force is the cap (under it: the loop's)."""
    events = []
    for _ in range(n):
        decision = GuardDecision(step=0, level=level, apply_update=applied)
        in_force = min(loop_lr, run.lr_ceiling)
        events += lift_cap(decision, run, excursion, (loop_lr, in_force), policy)
    return events


def test_the_cap_rises_after_each_healthy_stretch_and_is_gone_over_the_schedule():
    run = _capped(1e-3)
    assert _steps(run, 19, loop_lr=4e-3) == [] and run.lr_ceiling == 1e-3
    # 1.5x every 20 healthy steps: 1.5e-3, 2.25e-3, 3.375e-3, then 5.06e-3 > the loop's 4e-3
    assert _steps(run, 41, loop_lr=4e-3) == ["lr_lift:0.0015", "lr_lift:0.00225", "lr_lift:0.00338"]
    assert _steps(run, 20, loop_lr=4e-3) == ["lr_ceiling:off"]
    assert run.lr_ceiling == math.inf and _steps(run, 100) == []  # the schedule's LR again


def test_a_skip_or_an_accepted_outlier_starts_the_stretch_over():
    run = _capped(1e-3)
    _steps(run, 19)
    assert _steps(run, 1, applied=False) == [] and run.lift_quiet == 0
    assert _steps(run, 19) == []
    accepted = GuardDecision(step=0, events=("accept:loss_z=7.0",))
    assert lift_cap(accepted, run, False, (1.0, 1e-3), POLICY) == [] and run.lift_quiet == 0
    assert _steps(run, 20) == ["lr_lift:0.0015"]


def test_a_warn_brings_a_risen_cap_down_once_and_the_next_rise_stops_below_the_edge():
    run = _capped(1e-3)
    _steps(run, 60)  # three rises: 3.375e-3, the LR in force
    assert _steps(run, 5, level=WARN) == ["lr_fall:0.00169@0.00338"]  # one fall an episode
    assert run.lr_edge == pytest.approx(3.375e-3) and run.lr_ceiling == pytest.approx(1.6875e-3)
    # 1.5 x 1.6875e-3 = 2.53e-3 is over 0.7 x the edge: the rise stops at 2.3625e-3, for good
    assert _steps(run, 200) == ["lr_lift:0.00236"]
    assert run.lr_ceiling == pytest.approx(0.7 * 3.375e-3)


def test_an_excursion_falls_no_lower_than_the_rescue_and_an_unrisen_cap_does_not_fall():
    run = _capped(1e-3)
    assert _steps(run, 10, excursion=True) == [] and run.lr_ceiling == 1e-3
    assert run.lr_edge == math.inf  # trouble at the rescue's own cap is no edge
    _steps(run, 20)  # 1.5e-3
    assert _steps(run, 1, excursion=True) == ["lr_fall:0.001@0.0015"]  # 0.75e-3, floored
    assert run.lr_ceiling == 1e-3 and run.lr_edge == 1.5e-3


def test_with_the_forecasts_actions_off_a_warn_neither_lowers_nor_stalls_the_cap():
    reactive = GuardPolicy(lr_lift_steps=20, forecast_actions=False)
    run = _capped(1e-3)
    _steps(run, 20, policy=reactive)  # 1.5e-3
    assert _steps(run, 20, level=WARN, policy=reactive) == ["lr_lift:0.00225"]
    assert run.lr_edge == math.inf and not run.lift_troubled


def test_lr_lift_steps_zero_keeps_the_cap_for_the_run():
    run = _capped(1e-3)
    assert _steps(run, 500, policy=GuardPolicy(lr_lift_steps=0)) == [] and run.lr_ceiling == 1e-3


@pytest.mark.parametrize(
    ("field", "value"), [("lr_lift", 1.0), ("lr_fall", 0.0), ("lr_edge_share", 1.5)]
)
def test_the_lift_knobs_are_checked(field, value):
    with pytest.raises(ValueError, match=field):
        GuardPolicy(**{field: value})


def _train(guard, model, opt, loop, steps, lr) -> None:
    for _ in range(steps):
        for group in opt.param_groups:  # the loop sets the LR every step, as nanoGPT does
            group["lr"] = lr
        guard.step(loop.loss(model))
        opt.zero_grad()


def test_a_real_rescue_lifts_back_to_the_schedule_on_a_healthy_run(tmp_path):
    model, opt = tiny_model()
    loop = Loop()
    guard = Guard(model, opt, tmp_path, risk="off", record=False, policy=POLICY)
    _train(guard, model, opt, loop, 120, 3e-3)  # a checkpoint at step 100 at LR 3e-3
    guard.force_next("rescue")
    _train(guard, model, opt, loop, 1, 3e-3)
    assert guard.lr_ceiling == pytest.approx(1.5e-3)  # rescue_lr x the checkpoint's LR
    _train(guard, model, opt, loop, 100, 3e-3)
    lifts = [e for _, e in guard.events if e.startswith(("lr_lift", "lr_ceiling:off"))]
    # the first step after the rescue trains at the restored weights; 1.5e-3 x 1.5 = 2.25e-3,
    # then 3.375e-3 is over the loop's 3e-3: the cap is gone
    assert lifts == ["lr_lift:0.00225", "lr_ceiling:off"] and guard.lr_ceiling == math.inf
    assert guard.lr_in_force == pytest.approx(3e-3)
    guard.close()


def test_the_edge_and_the_lift_survive_a_checkpoint_and_old_checkpoints_load(tmp_path):
    model, opt = tiny_model()
    guard = Guard(model, opt, tmp_path, risk="off", record=False)
    run = guard.run
    run.lr_ceiling, run.lr_floor, run.lr_edge = 2e-3, 1e-3, 4e-3
    run.lift_quiet, run.lift_troubled, run.lr_anchor = 7, True, 0.3
    state = guard.state_dict()
    torch.save(state, tmp_path / "state.pt")
    back = Guard(model, opt, tmp_path / "b", risk="off", record=False)
    back.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    kept = ("lr_ceiling", "lr_floor", "lr_edge", "lift_quiet", "lift_troubled", "lr_anchor")
    assert [getattr(back.run, k) for k in kept] == [2e-3, 1e-3, 4e-3, 7, True, 0.3]
    for name in kept[1:]:  # a checkpoint saved before issue 32
        del state["run"][name]
    old = Guard(model, opt, tmp_path / "c", risk="off", record=False).load_state_dict(state)
    assert old.lr_ceiling == 2e-3 and old.run.lr_edge == math.inf and old.run.lift_quiet == 0
    assert old.run.lr_anchor == math.inf  # a cap that stands still, as it did then
    for g in (guard, back, old):
        g.close()


def _precursor_step(noise: float) -> int | None:
    """A loss settled at 2.0 (alternating +-``noise``), then at 2.2: the first step the
    loss is a precursor (None: within 100 steps, none)."""
    online, history = OnlineLabel(POLICY.collapse_confirm_steps), OutlierHistory(128, 20)
    for step in range(200):
        loss = 2.0 + (noise if step % 2 else -noise)
        online.update(step, loss)
        history.add(loss)
        assert not precursor(online, history, step, POLICY)
    for step in range(200, 300):
        online.update(step, 2.2)
        if precursor(online, history, step, POLICY):
            return step
    return None


def test_a_smoothed_loss_over_its_best_by_lr_lift_loss_rise_is_a_precursor():
    # the EWMA (weight a = 1 - exp(-1/10)) climbs 0.2 x (1 - exp(-n / 10)): over 0.1 from
    # n = 7, and the label's excursion (0.25 over the best) never opens
    assert _precursor_step(noise=0.0) == 206
    # losses 0.4 apart step to step: a batch's noise of 0.4 / sqrt 2 = 0.28, the smoothed
    # loss's 0.28 x sqrt(a / (2 - a)) = 0.063; six of them, 0.38, are over the 0.2 the loss
    # rose: no precursor (the excursion neither)
    assert _precursor_step(noise=0.2) is None
