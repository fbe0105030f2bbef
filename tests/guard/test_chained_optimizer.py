"""ChainedOptimizer: several torch optimizers as one, whose LR a rollback keeps reaching."""

from __future__ import annotations

import math

import pytest
import torch
from guard_helpers import Loop, nan_weight_run, tiny_model

from collapse_guard.guard.check import lr_reaches
from collapse_guard.integrations.chained import ChainedOptimizer
from collapse_guard.probe.optimizer_state import optimizer_parts


def _halves(model: torch.nn.Module) -> tuple[list, list]:
    matrices = [p for n, p in model.named_parameters() if p.dim() == 2 and "blocks" in n]
    rest = [p for p in model.parameters() if all(p is not m for m in matrices)]
    return matrices, rest


def _chain(model: torch.nn.Module, lr: float = 3e-3) -> ChainedOptimizer:
    matrices, rest = _halves(model)
    return ChainedOptimizer(
        torch.optim.SGD(matrices, lr=lr, momentum=0.9), torch.optim.AdamW(rest, lr=lr)
    )


def test_a_chain_steps_as_its_optimizers_side_by_side():
    (model, _), (twin, _) = tiny_model(seed=3), tiny_model(seed=3)
    chain = _chain(model)
    matrices, rest = _halves(twin)
    sgd, adamw = torch.optim.SGD(matrices, lr=3e-3, momentum=0.9), torch.optim.AdamW(rest, lr=3e-3)
    loop, twin_loop = Loop(seed=3), Loop(seed=3)
    for _ in range(3):
        loop.loss(model)
        chain.step()
        chain.zero_grad()
        twin_loop.loss(twin)
        sgd.step(), adamw.step()
        sgd.zero_grad(), adamw.zero_grad()
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    assert len(chain.state) == len(list(model.parameters()))
    assert [kind for kind, _ in optimizer_parts(chain)] == ["sgd", "adam"]


def test_an_lr_set_after_a_restore_reaches_every_optimizer():
    model, _ = tiny_model()
    chain = _chain(model)
    saved = chain.state_dict()
    chain.load_state_dict(saved)
    for group in chain.param_groups:
        group["lr"] = 0.25
    inner = [g["lr"] for o in chain.optimizers for g in o.param_groups]
    assert inner == [0.25, 0.25] and lr_reaches(chain)
    with pytest.raises(ValueError, match="holds 1 optimizers' states under 'optimizers'"):
        chain.load_state_dict({"optimizers": saved["optimizers"][:1]})
    with pytest.raises(TypeError, match="got Linear"):
        ChainedOptimizer(torch.nn.Linear(2, 2))


def test_a_group_added_to_the_chain_itself_is_refused():
    model, _ = tiny_model()
    chain = _chain(model)
    extra = torch.nn.Parameter(torch.ones(3))
    with pytest.raises(TypeError, match="would never train; add the group to one of"):
        chain.add_param_group({"params": [extra]})
    assert len(chain.param_groups) == 2  # the chain is as it was
    chain.optimizers[1].add_param_group({"params": [extra]})
    assert len(ChainedOptimizer(*chain.optimizers).param_groups) == 3


def test_a_guarded_chain_is_rescued_and_its_cap_reaches_both_optimizers(tmp_path):
    model, _ = tiny_model(seed=1)
    chain = _chain(model)
    stepped: list[list[float]] = []  # the LR each optimizer steps with, at every step
    for optimizer in chain.optimizers:
        optimizer.register_step_pre_hook(
            lambda o, args, kwargs: stepped.append([o.param_groups[0]["lr"]])
        )
    rescues, caught = nan_weight_run(model, chain, tmp_path)
    assert rescues == [92]
    before, after = stepped[2 * 80 : 2 * 81], stepped[-2:]  # both optimizers, steps 80, 99
    assert before == [[3e-3], [3e-3]]
    assert after[0] == after[1] and after[0][0] <= 0.5 * 3e-3 + 1e-12  # the rescue's cap
    assert not [w for w in caught if "no longer reaches" in str(w.message)]
    assert all(math.isfinite(p.detach().sum().item()) for p in model.parameters())
