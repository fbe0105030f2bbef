"""Real runs: the optimizers; Lion checked against its update worked out by hand."""

from __future__ import annotations

import pytest
import torch

from collapse_guard.datasets.real import OPTIMIZERS, RealRunConfig
from collapse_guard.datasets.real.optim import Lion, build_optimizer


def test_lion_matches_a_hand_computed_update_on_two_parameters():
    # two scalars, lr 0.1, betas (0.9, 0.99), weight decay 0.5 on both
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    lion = Lion([w], lr=0.1, betas=(0.9, 0.99), weight_decay=0.5)
    # step 1: m = 0, g = (3, -0.5): c = 0.1 g -> sign (+, -)
    #   w = (1, -2) * (1 - 0.1 * 0.5) - 0.1 * (1, -1) = (0.85, -1.8)
    #   m = 0.01 g = (0.03, -0.005)
    w.grad = torch.tensor([3.0, -0.5])
    lion.step()
    torch.testing.assert_close(w.data, torch.tensor([0.85, -1.8]))
    torch.testing.assert_close(lion.state[w]["exp_avg"], torch.tensor([0.03, -0.005]))
    # step 2: g = (-0.1, 0.01): c = 0.9 m + 0.1 g = (0.027 - 0.01, -0.0045 + 0.001)
    #   = (0.017, -0.0035) -> sign (+, -): the momentum outvotes the new gradient's sign
    #   w = (0.85, -1.8) * 0.95 - 0.1 * (1, -1) = (0.7075, -1.61)
    #   m = 0.99 m + 0.01 g = (0.0297 - 0.001, -0.00495 + 0.0001) = (0.0287, -0.00485)
    w.grad = torch.tensor([-0.1, 0.01])
    lion.step()
    torch.testing.assert_close(w.data, torch.tensor([0.7075, -1.61]))
    torch.testing.assert_close(lion.state[w]["exp_avg"], torch.tensor([0.0287, -0.00485]))


def test_lion_refuses_bad_hyperparameters():
    w = torch.nn.Parameter(torch.zeros(1))
    with pytest.raises(ValueError, match="betas"):
        Lion([w], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="lr"):
        Lion([w], lr=-1.0)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_build_optimizer_decays_matrices_only(name):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    config = RealRunConfig(optimizer=name, lr=0.2, warmup_steps=1, weight_decay=0.1, beta1=0.8)
    optimizer = build_optimizer(config, model)
    decay, no_decay = optimizer.param_groups
    assert [p.dim() for p in decay["params"]] == [2] and decay["weight_decay"] == 0.1
    assert all(p.dim() == 1 for p in no_decay["params"]) and no_decay["weight_decay"] == 0.0
    assert decay["lr"] == pytest.approx(0.2)
    expected = {"adamw": torch.optim.AdamW, "lion": Lion, "sgd": torch.optim.SGD}[name]
    assert type(optimizer) is expected
    if name == "sgd":
        assert decay["momentum"] == 0.8 and decay["nesterov"]
