"""A rollback across ``optimizer.add_param_group`` (progressive unfreezing): the groups the
checkpoint had take its state, those added since start afresh, and the user's loop goes on
(torch's ``load_state_dict`` refused the checkpoint, and the rescue stopped training)."""

from __future__ import annotations

import warnings

import pytest
import torch
from guard_helpers import Loop, tiny_model

from collapse_guard.guard import Guard
from collapse_guard.guard.regroup import GROWN, RESET, load_across_groups
from collapse_guard.guard.state import Training


def _stepped(params: list, groups: int = 1) -> torch.optim.AdamW:
    """AdamW over ``params`` split into ``groups`` groups, after one step on fixed grads."""
    size = len(params) // groups
    optimizer = torch.optim.AdamW(
        [{"params": params[i * size : (i + 1) * size]} for i in range(groups)], lr=1e-3
    )
    for i, p in enumerate(params):
        p.grad = torch.full_like(p, 0.1 * (i + 1))
    optimizer.step()
    return optimizer


def test_the_groups_it_had_take_the_checkpoints_state_and_an_added_one_starts_afresh():
    params = [torch.nn.Parameter(torch.ones(3)) for _ in range(4)]
    saved = _stepped(params[:2]).state_dict()
    optimizer = _stepped(params[:2])
    optimizer.step()  # a second step: its state is no longer the checkpoint's
    optimizer.add_param_group({"params": params[2:], "lr": 5e-4})
    for p in params[2:]:
        p.grad = torch.ones(3)
    optimizer.step()  # the added group has state now
    assert load_across_groups(optimizer, saved) == GROWN
    for i, p in enumerate(params[:2]):
        assert torch.equal(optimizer.state[p]["exp_avg"], saved["state"][i]["exp_avg"])
        assert float(optimizer.state[p]["step"]) == 1.0
    assert all(not optimizer.state[p] for p in params[2:])  # afresh, as when added
    assert [g["lr"] for g in optimizer.param_groups] == [1e-3, 5e-4]


def test_the_same_layout_loads_as_torch_does_and_another_change_starts_afresh():
    params = [torch.nn.Parameter(torch.ones(3)) for _ in range(4)]
    saved = _stepped(params, groups=2).state_dict()
    same = _stepped(params, groups=2)
    assert load_across_groups(same, saved) == ""
    assert torch.equal(same.state[params[3]]["exp_avg"], saved["state"][3]["exp_avg"])
    regrouped = _stepped(params, groups=1)  # one group of four against two of two
    assert load_across_groups(regrouped, saved) == RESET.format(
        error="loaded state dict has a different number of parameter groups"
    )
    assert all(not regrouped.state[p] for p in params)


def test_a_rescue_after_add_param_group_rolls_back_and_training_goes_on(tmp_path):
    model, _ = tiny_model()
    frozen = model.tok_emb.weight
    frozen.requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p is not frozen], lr=3e-3)
    guard = Guard(model, optimizer, tmp_path, risk="off", policy={"checkpoint_every": 20})
    loop = Loop()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(60):
            if step == 32:  # unfrozen: a group the ring's checkpoints (10, 30) lack
                frozen.requires_grad_(True)
                optimizer.add_param_group({"params": [frozen]})
            if step == 35:
                guard.force_next("rescue")
            guard.step(loop.loss(model))
            optimizer.zero_grad()
    guard.close()
    rollbacks = [e for _, e in guard.events if e.startswith("rollback:")]
    assert guard.rescues == 1 and rollbacks and rollbacks[0].endswith("@31")
    said = [w for w in caught if "more parameter groups" in str(w.message)]
    assert len(said) == 1 and len(optimizer.param_groups) == 2
    assert optimizer.state[frozen]  # the added group trained on after the rollback
    assert torch.isfinite(frozen).all()


def test_a_resume_still_refuses_an_optimizer_of_another_layout():
    """Only a rollback mends the layout: a resume loads into the optimizer the user built
    for it, and a mismatch there is theirs to see."""
    params = [torch.nn.Parameter(torch.ones(3)) for _ in range(4)]
    saved = {"model": {}, "optimizer": _stepped(params, groups=2).state_dict()}
    training = Training(torch.nn.Module(), _stepped(params, groups=1))
    with pytest.raises(ValueError, match="parameter groups"):
        training.load(saved)
