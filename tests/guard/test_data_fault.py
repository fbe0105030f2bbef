"""Data that goes bad for good: the guard skips it, says so once, and stops at a bound."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from guard_helpers import VOCAB, Loop, tiny_model

from collapse_guard.guard import Guard, GuardGaveUp


def _corrupt_loss(model: torch.nn.Module, generator: torch.Generator) -> torch.Tensor:
    """A batch of random tokens: a pipeline gone bad (the model learned a sequence)."""
    x, y = torch.randint(0, VOCAB, (2, 8, 16), generator=generator)
    _, loss = model(x, y)
    loss.backward()
    return loss


def _into_data_fault(tmp_path, limit: int) -> tuple[Guard, torch.nn.Module, torch.optim.Optimizer]:
    """A healthy stretch with checkpoints, then a rescue of non-finite losses: the guard
    and its training, at the ring's average."""
    model, opt = tiny_model()
    loop = Loop()
    policy = {"checkpoint_every": 10, "max_data_fault_skips": limit}
    guard = Guard(model, opt, tmp_path, risk="off", policy=policy)
    for _ in range(200):
        guard.step(loop.loss(model))
        opt.zero_grad()
    for _ in range(guard.policy.max_skip_streak):
        loop.loss(model)
        rescue = guard.step(torch.tensor(math.nan))
        opt.zero_grad()
    assert rescue.rescue
    return guard, model, opt


def test_data_that_stays_bad_is_skipped_then_stops_the_run_with_what_to_check(tmp_path):
    guard, model, opt = _into_data_fault(tmp_path, limit=25)
    generator = torch.Generator().manual_seed(1)
    decisions = []
    with warnings.catch_warnings(record=True) as said, pytest.raises(GuardGaveUp) as stop:
        warnings.simplefilter("always")
        for _ in range(40):
            decisions.append(guard.step(_corrupt_loss(model, generator)))
            opt.zero_grad()
    # the ring's average sees it first (rolled back to the newest checkpoint alone), then
    # the newest, healthy weights: the data went bad
    assert decisions[0].rescue and decisions[0].reason.startswith("average_worse")
    assert any(e.startswith("data_fault:loss_z") for e in decisions[1].events)
    # every corrupt batch after it skipped, none trained on, up to the bound: the 25th stops
    faulty = decisions[1:]
    assert len(faulty) == 24 and all(d.skipped and d.data_fault for d in faulty)
    assert "the last 25 batches" in str(stop.value) and "data pipeline" in str(stop.value)
    told = [str(w.message) for w in said if "the data went bad" in str(w.message)]
    assert len(told) == 1 and "after 25 skipped in a row the guard stops" in told[0]
    assert guard.run_path.exists()  # closed on the way out


def test_max_data_fault_skips_0_skips_without_limit(tmp_path):
    guard, model, opt = _into_data_fault(tmp_path, limit=0)
    generator = torch.Generator().manual_seed(1)
    decisions = []
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for _ in range(60):
            decisions.append(guard.step(_corrupt_loss(model, generator)))
            opt.zero_grad()
    assert any("no bound on a streak" in str(w.message) for w in said)
    assert decisions[0].rescue  # the ring's average, then the newest checkpoint alone
    assert all(d.skipped and d.data_fault and not d.give_up for d in decisions[1:])
    guard.close()
