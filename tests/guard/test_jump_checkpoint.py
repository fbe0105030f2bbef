"""A jump's rescue undoes the jump alone (issue 32): the guard checkpoints the weights
before the update of a jump of the loop's LR, and the rescue of that jump rolls back to
them, not to the ring's average of the last 100-300 steps."""

from __future__ import annotations

import warnings
from collections import deque

import torch
from guard_helpers import Loop, tiny_model

from collapse_guard.guard import Guard, GuardPolicy
from collapse_guard.guard.checkpoints import CheckpointRing
from collapse_guard.guard.reactive import jump_starts

POLICY = GuardPolicy()


def _starts(schedule: list[float]) -> list[int]:
    """The steps at which a jump starts, the LRs fed as the guard feeds them."""
    lrs: deque[float] = deque(maxlen=2 * POLICY.lr_jump_steps)
    steps = []
    for step, lr in enumerate(schedule):
        if jump_starts(lrs, lr, POLICY):
            steps.append(step)
        lrs.append(lr)
    return steps


def test_a_jump_starts_once_and_a_smooth_rise_never():
    assert _starts([1e-3] * 50 + [1e-2] * 50) == [50]
    rewarm = [0.5] * 50 + [0.5 + 3.5 * (k + 1) / 5 for k in range(5)] + [4.0] * 20
    assert _starts(rewarm) == [50]  # its later steps rise 1.3-2.4x: the same jump
    assert _starts([1e-3] * 30 + [1e-2] * 5 + [1e-3] * 30 + [1e-2] * 5) == [30, 65]
    ramp = [1e-3 * (1 + 99 * min(1.0, k / 300)) for k in range(400)]
    assert _starts(ramp) == []  # under 2x a step


def _run(folder, jump_at: int, steps: int = 90) -> tuple[Guard, dict[str, torch.Tensor]]:
    """A tiny model at 3e-3, 100x from ``jump_at`` on: the guard, and the weights the
    loop saw just before the jump's update."""
    model, opt = tiny_model()
    loop, guard = Loop(), Guard(model, opt, folder, risk="off", record=False)
    before = {}
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = 3e-3 * (100.0 if step >= jump_at else 1.0)
        if step == jump_at:
            before = {k: v.detach().clone() for k, v in model.state_dict().items()}
        guard.step(loop.loss(model))
        opt.zero_grad()
    guard.close()
    return guard, before


def _events(guard: Guard, prefix: str) -> list[tuple[int, str]]:
    return [(s, e) for s, e in guard.events if e.startswith(prefix)]


def test_the_rescue_of_a_jump_rolls_back_to_the_weights_before_it(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        guard, before = _run(tmp_path, jump_at=60)
    assert _events(guard, "checkpoint:before_jump") == [(60, "checkpoint:before_jump")]
    (rescued, _), *_ = _events(guard, "rescue:lr_jump")
    assert rescued == 63  # the jump's update applied, two outliers skipped, the third rescued
    # one checkpoint, the one written at the jump, not the ring's mean of steps 0-50
    assert _events(guard, "rollback:") == [(63, "rollback:avg1@60")]
    restored = torch.load(tmp_path / "guard-000000060.pt", weights_only=True)["model"]
    for name, value in before.items():
        torch.testing.assert_close(restored[name], value, rtol=0, atol=0)


def test_no_checkpoint_before_a_jump_the_guard_cannot_call_healthy(tmp_path):
    # at step 5 the run has had no 10 quiet steps (GuardPolicy.healthy_quiet_steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        guard, _ = _run(tmp_path, jump_at=5, steps=40)
    assert _events(guard, "checkpoint:before_jump") == []
    assert guard.run.jump_checkpoint is None


def test_the_ring_names_a_checkpoint_only_while_it_holds_it(tmp_path):
    ring = CheckpointRing(tmp_path, keep=2)
    for step in (10, 20, 30):
        ring.save(step, {"model": {}, "loss": 3.0 - step / 100})
    assert ring.at(10) is None  # left the ring (the best, 30, is its newest)
    assert ring.at(20) == tmp_path / "guard-000000020.pt"
    assert ring.at(None) is None
