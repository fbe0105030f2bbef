"""A developed collapse whose ring trained worse rolls back past the ring to the best
checkpoint it wrote (``GuardPolicy.rewind_loss_gap``, issue 32): the ring keeps that one
after it leaves, and a rewind drops the abandoned trajectory's checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from guard_helpers import Loop, tiny_model

from collapse_guard.guard import Guard, GuardPolicy
from collapse_guard.guard.amend import with_rollback, worse_by
from collapse_guard.guard.checkpoints import CheckpointRing, load_verified
from collapse_guard.guard.decision import GuardDecision


def _ring(tmp_path, losses: dict[int, float], keep: int = 3) -> CheckpointRing:
    ring = CheckpointRing(tmp_path, keep=keep)
    for step, loss in losses.items():
        ring.save(step, {"model": {"w": torch.full((2,), float(step))}, "loss": loss})
    return ring


def _names(paths) -> list[str]:
    return [p.name[-9:-3] for p in paths]


def test_the_ring_keeps_its_best_checkpoint_after_it_leaves(tmp_path):
    ring = _ring(tmp_path, {100: 3.0, 200: 2.5, 300: 2.6, 400: 2.8, 500: 2.9})
    assert _names(ring.paths()) == ["000300", "000400", "000500"]
    assert _names([ring.best()]) == ["000200"]
    assert _names(ring.existing()) == ["000200", "000300", "000400", "000500"]  # 100 gone
    ring.save(600, {"model": {"w": torch.zeros(2)}, "loss": 2.4})  # a new best: 200 goes
    assert _names([ring.best()]) == ["000600"]
    assert _names(ring.existing()) == ["000400", "000500", "000600"]


def test_a_rewind_leaves_the_best_alone_in_the_ring(tmp_path):
    ring = _ring(tmp_path, {100: 3.0, 200: 2.5, 300: 2.6, 400: 2.8, 500: 2.9})
    assert ring.rewind() == ["guard-000000300.pt", "guard-000000400.pt", "guard-000000500.pt"]
    assert _names(ring.paths()) == _names(ring.existing()) == ["000200"]
    ring.save(480, {"model": {"w": torch.zeros(2)}, "loss": 2.55})  # the new trajectory
    assert _names(ring.basin(300, 0.05)) == ["000200", "000480"]


def test_a_resume_keeps_the_lineages_best_checkpoint(tmp_path):
    # five checkpoints of a run (a ring of 5 wrote them); the resumed ring keeps 3
    _ring(tmp_path, {100: 3.0, 200: 2.5, 300: 2.6, 400: 2.8, 500: 2.9}, keep=5)
    resumed = CheckpointRing(tmp_path, keep=3)
    assert resumed.adopt(tmp_path / "guard-000000500.pt") == ["guard-000000100.pt"]
    assert _names(resumed.paths()) == ["000300", "000400", "000500"]
    assert _names([resumed.best()]) == ["000200"]
    assert _names(resumed.existing()) == ["000200", "000300", "000400", "000500"]
    assert round(worse_by(resumed), 6) == 0.4


def _rescue(reason: str) -> GuardDecision:
    return GuardDecision(step=501, apply_update=False, rescue=True, reason=reason)


def test_a_developed_rescue_rolls_back_past_a_ring_that_trained_worse(tmp_path):
    ring = _ring(tmp_path, {100: 3.0, 200: 2.5, 300: 2.6, 400: 2.68, 500: 2.72})
    assert round(worse_by(ring), 6) == 0.22
    decision = with_rollback(_rescue("online_collapse"), ring, GuardPolicy())
    assert _names(map(Path, decision.rollback_to)) == ["000200"]
    assert decision.rewind and decision.events == ("rewind:loss_gap=0.22",)
    # the forecast's rescues (a rise, or a stall, under the warn's hold) are of a developed
    # collapse too
    assert with_rollback(_rescue("warn_rise"), ring, GuardPolicy()).rewind
    assert with_rollback(_rescue("warn_stall"), ring, GuardPolicy()).rewind
    # a sudden collapse (non-finite losses) came from where the ring is: no rewind
    sudden = with_rollback(_rescue("nonfinite_loss"), ring, GuardPolicy())
    assert not sudden.rewind and len(sudden.rollback_to) == 3
    # under the gap (0.22 < 0.3), and with the rule off, the ring's basin as before
    for policy in (GuardPolicy(rewind_loss_gap=0.3), GuardPolicy(rewind_loss_gap=0)):
        kept = with_rollback(_rescue("online_collapse"), ring, policy)
        basin = _names(map(Path, kept.rollback_to))
        assert not kept.rewind and basin == ["000300", "000400", "000500"]


def test_a_damaged_best_checkpoint_leaves_the_rescue_to_the_ring(tmp_path):
    ring = _ring(tmp_path, {100: 3.0, 200: 2.5, 300: 2.6, 400: 2.68, 500: 2.72})
    best = ring.best()
    best.write_bytes(best.read_bytes()[:-10])  # truncated after it was written
    with pytest.warns(RuntimeWarning, match="no rewind to guard-000000200.pt .*truncated"):
        decision = with_rollback(_rescue("online_collapse"), ring, GuardPolicy())
    assert not decision.rewind and _names(map(Path, decision.rollback_to)) == [
        "000300", "000400", "000500"
    ]  # fmt: skip


def _drifting_run(
    tmp_path, gap: float, risk="off", warn_rescue: bool = True
) -> tuple[Guard, dict[int, dict], list[int]]:
    """A real tiny GPT whose reported loss stands 0.2 nats higher from step 250 (a run
    that trains worse, healthy by every rule: under the label's 0.25 margin), then climbs
    0.02 a step from 330 until the online label rescues it. Returns the guard, the model's
    state right after each rescue and the rescues' steps."""
    model, optimizer = tiny_model(seed=0, lr=3e-3)
    loop = Loop(seed=0)
    policy = {"qk_clip": "off", "rewind_loss_gap": gap, "warn_rescue": warn_rescue}
    guard = Guard(model, optimizer, tmp_path, risk=risk, policy=policy, preflight=False)
    after, rescues = {}, []
    for step in range(372):
        drift = 0.0 if step < 250 else 0.2 + max(0, step - 330) * 0.02
        decision = guard.step(loop.loss(model) + drift)
        optimizer.zero_grad()
        if decision.rescue:
            rescues.append(step)
            after[step] = {k: v.clone() for k, v in model.state_dict().items()}
    guard.close()
    return guard, after, rescues


def test_a_run_that_trained_worse_is_rolled_back_to_its_best_checkpoint(tmp_path):
    guard, after, rescues = _drifting_run(tmp_path, gap=GuardPolicy().rewind_loss_gap)
    assert rescues == [364]
    events = [e for s, e in guard.events if s == 364]
    assert "rewind:loss_gap=0.134" in events and "rollback:avg1@211" in events
    best = load_verified(tmp_path / "guard-000000211.pt")  # the state after step 210
    assert all(torch.equal(after[364][k], v) for k, v in best["model"].items())
    # the checkpoint of the abandoned trajectory (after step 316) is gone, the best stays
    names = sorted(p.name for p in tmp_path.glob("guard-*.pt"))
    assert names == ["guard-000000211.pt", "guard-origin.pt"]  # the origin is no ring's


def test_under_the_gap_the_rescue_rolls_back_to_the_ring_as_before(tmp_path):
    # the default before 2026-12-07 (0.15): the ring's 0.134 nats stand under it
    guard, _, rescues = _drifting_run(tmp_path, gap=0.15)
    assert rescues == [364]
    events = [e for s, e in guard.events if s == 364]
    assert "rollback:avg1@317" in events and not any(e.startswith("rewind") for e in events)


@pytest.mark.parametrize("warn_rescue", [True, False])
def test_a_rise_under_the_warns_hold_is_rescued_at_once(tmp_path, fixed_risk, warn_rescue):
    # the same run held at warn from its first reading: the loss's step up at 250 is a
    # precursor, and with warn_rescue the forecast rescues then, not at the label's 364
    guard, _, rescues = _drifting_run(tmp_path, 0.15, fixed_risk("warn"), warn_rescue)
    reasons = [e for s, e in guard.events if e.startswith("rescue:")]
    if warn_rescue:
        assert reasons[0] == "rescue:warn_rise" and 250 <= rescues[0] < 300
        assert reasons[1:] == ["rescue:online_collapse"] * (len(reasons) - 1)  # once only
    else:
        assert reasons == ["rescue:online_collapse"] and len(rescues) == 1 and rescues[0] > 330
