"""A first rescue in the run's warmup restarts from the weights the guard started with
(``GuardPolicy.restart_window``, issue 32): every ring checkpoint was trained at the rising
LRs the run could not absorb. The origin is written at the guard's first step; the cap
warms up again over the loop's first rise."""

from __future__ import annotations

import math

import pytest
import torch
from guard_helpers import Loop, tiny_model

from collapse_guard.guard import Guard, GuardPolicy
from collapse_guard.guard.amend import restarts
from collapse_guard.guard.checkpoints import CheckpointRing, load_verified
from collapse_guard.guard.decision import GuardDecision
from collapse_guard.guard.state import RunState


def _rescue(reason: str, step: int = 200, ring: tuple[str, ...] = ("guard-000000101.pt",)):
    return GuardDecision(
        step=step, apply_update=False, rescue=True, reason=reason, rollback_to=ring
    )


def _run(rise_ended: int | None, rescues: int = 0) -> RunState:
    run = RunState.fresh(GuardPolicy())
    run.rise_ended, run.rescues = rise_ended, rescues
    return run


@pytest.fixture
def origin(tmp_path):
    ring = CheckpointRing(tmp_path)
    return ring.save_origin(0, {"model": {"w": torch.zeros(2)}, "loss": math.nan})


def test_a_first_rescue_of_a_collapse_in_the_warmup_restarts(origin):
    policy = GuardPolicy()
    for reason in ("online_collapse", "warn_rise", "warn_stall", "nonfinite_loss", "skip_streak=3"):
        assert restarts(_rescue(reason), _run(None), policy, origin), reason
    assert restarts(_rescue("online_collapse", 200), _run(150), policy, origin)  # 50 after
    # past the window, a second rescue, an LR jump's outliers, a correction, a drill: no
    assert not restarts(_rescue("online_collapse", 201), _run(150), policy, origin)
    assert not restarts(_rescue("online_collapse"), _run(None, rescues=1), policy, origin)
    for reason in ("lr_jump:loss_z=9.0", "average_worse:loss_z=8.1", "forced"):
        assert not restarts(_rescue(reason), _run(None), policy, origin), reason
    off = GuardPolicy(restart_window=0)
    assert not restarts(_rescue("online_collapse"), _run(None), off, origin)


def test_a_missing_or_damaged_origin_leaves_the_rescue_to_the_ring(origin):
    policy, decision = GuardPolicy(), _rescue("online_collapse")
    origin.write_bytes(origin.read_bytes()[:-10])
    with pytest.warns(RuntimeWarning, match="no restart to guard-origin.pt .*truncated"):
        assert not restarts(decision, _run(None), policy, origin)
    origin.unlink()
    assert not restarts(decision, _run(None), policy, origin)


def test_the_first_rise_ends_at_the_first_lr_that_does_not_rise():
    run = RunState.fresh(GuardPolicy())
    for step, lr in enumerate([0.0, 1e-4, 2e-4, 3e-4, 3e-4, 4e-4]):
        run.step_index = step
        run.note_loop_lr(lr)
    assert run.rise_ended == 4  # and stays: a later rise (a re-warm) is no warmup
    flat = RunState.fresh(GuardPolicy())
    for step in range(3):
        flat.step_index = step
        flat.note_loop_lr(1e-3)
    assert flat.rise_ended == 1
    saved = RunState.fresh(GuardPolicy())
    saved.load_state_dict(run.state_dict())
    assert saved.rise_ended == 4


def test_with_no_ring_checkpoint_a_collapse_restarts_at_any_time(origin):
    decision = _rescue("nonfinite_loss", step=900, ring=())  # the ring is empty
    assert restarts(decision, _run(100, rescues=2), GuardPolicy(), origin)
    jump = _rescue("lr_jump:grad_z=12.0", 900, ring=())
    assert not restarts(jump, _run(100), GuardPolicy(), origin)


def test_a_restart_empties_the_ring_and_keeps_the_origin(tmp_path):
    ring = CheckpointRing(tmp_path)
    ring.save_origin(0, {"model": {"w": torch.zeros(2)}, "loss": math.nan})
    for step, loss in {100: 3.0, 200: 2.5, 300: 2.6, 400: 2.8}.items():
        ring.save(step, {"model": {"w": torch.ones(2)}, "loss": loss})
    assert ring.restart() == [f"guard-000000{s}.pt" for s in (200, 300, 400)]  # best 200 too
    assert ring.paths() == [] and ring.best() is None and ring.existing() == []
    assert ring.origin().exists() and load_verified(ring.origin())["step"] == 0


def _warmup_run(tmp_path, warmup: int, drift_from: int, window: int | None = None):
    """A real tiny GPT whose loop warms its LR up linearly to 3e-3 over ``warmup`` steps;
    from ``drift_from`` its reported loss climbs 0.02 a step (a developed collapse) until
    the online label rescues it. Returns the guard, the initial weights, the weights right
    after the first rescue, its step and the LR in force at every step."""
    model, optimizer = tiny_model(seed=0, lr=3e-3)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    policy = {"qk_clip": "off"} | ({"restart_window": window} if window is not None else {})
    guard = Guard(model, optimizer, tmp_path, risk="off", policy=policy, preflight=False)
    loop, after, rescued, lrs = Loop(seed=0), None, None, []
    for step in range(drift_from + 120):
        for group in optimizer.param_groups:
            group["lr"] = 3e-3 * min(1.0, (step + 1) / warmup)
        drift = max(0, step - drift_from) * 0.02
        decision = guard.step(loop.loss(model) + drift)
        optimizer.zero_grad()
        lrs.append(guard.lr_in_force)
        if decision.rescue and rescued is None:
            rescued, drift_from = step, 10**9  # the collapse is over once rescued
            after = {k: v.clone() for k, v in model.state_dict().items()}
    guard.close()
    return guard, initial, after, rescued, lrs


def test_a_collapse_in_the_warmup_restarts_from_the_initial_weights(tmp_path):
    guard, initial, after, step, lrs = _warmup_run(tmp_path, warmup=400, drift_from=200)
    events = [e for s, e in guard.events if s == step]
    assert "rescue:online_collapse" in events and "restart:origin" in events
    assert "rollback:avg1@0" in events
    assert all(torch.equal(after[k], v) for k, v in initial.items())
    # a developed collapse's cap: a quarter of the LR of the ring's newest checkpoint
    newest = max(s for s, e in guard.events if e == "checkpoint" and s < step)
    ceiling = next(float(e.split(":")[1]) for e in events if e.startswith("lr_ceiling:"))
    assert ceiling == pytest.approx(0.25 * lrs[newest], rel=2e-3)
    # the cap warms up again over the rise so far (the rescue's step: still rising)
    assert lrs[step + 1] == pytest.approx(ceiling / step, rel=2e-3)  # ceiling: 3 digits
    assert lrs[step + 50] == pytest.approx(ceiling * 50 / step, rel=2e-3)
    assert (tmp_path / "guard-origin.pt").exists()


def test_past_the_warmup_or_with_the_rule_off_the_ring_is_rolled_back_to(tmp_path):
    guard, initial, after, step, _ = _warmup_run(tmp_path / "late", warmup=50, drift_from=250)
    events = [e for s, e in guard.events if s == step]
    assert step > 100 and "restart:origin" not in events
    assert any(e.startswith("rollback:avg") and not e.endswith("@0") for e in events)
    assert not all(torch.equal(after[k], v) for k, v in initial.items())
    guard, *_ = _warmup_run(tmp_path / "off", warmup=400, drift_from=200, window=0)
    assert not any(e == "restart:origin" for _, e in guard.events)
    assert any(e.startswith("rollback:avg") and not e.endswith("@0") for _, e in guard.events)
    assert not (tmp_path / "off" / "guard-origin.pt").exists()  # off: none written


def test_the_origin_is_the_state_before_the_first_update_and_a_resume_keeps_it(tmp_path):
    model, optimizer = tiny_model(seed=0)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    guard = Guard(model, optimizer, tmp_path, risk="off", policy={"checkpoint_every": 20})
    loop = Loop(seed=0)
    for _ in range(30):
        guard.step(loop.loss(model))
        optimizer.zero_grad()
    guard.close()
    origin = load_verified(tmp_path / "guard-origin.pt")
    assert origin["step"] == 0 and all(
        torch.equal(origin["model"][k], v) for k, v in initial.items()
    )
    resumed = Guard(model, optimizer, tmp_path, risk="off", policy={"checkpoint_every": 20})
    with pytest.warns(RuntimeWarning, match="resuming at step 30"):
        resumed.resume()  # from the ring's newest (the run went on past it)
    resumed.step(loop.loss(model))
    resumed.close()
    again = load_verified(tmp_path / "guard-origin.pt")
    assert all(torch.equal(again["model"][k], v) for k, v in initial.items())


def test_a_killed_origin_write_is_cleaned_at_the_next_start(tmp_path):
    gone = tmp_path / ".guard-origin.pt.999999999-ab12.tmp"  # no such pid runs
    gone.write_bytes(b"half")
    assert CheckpointRing(tmp_path).clean() == [gone.name] and not gone.exists()
