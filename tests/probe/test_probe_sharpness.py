"""Sharpness: power iteration against a quadratic whose top eigenvalue is known."""

from __future__ import annotations

import math

import pytest
import torch
from probe_models import loss_steps, tiny_gpt, token_batches, train
from torch import nn

from collapse_guard.probe import Probe, ProbeConfig


class Quadratic(nn.Module):
    def __init__(self, eigenvalues: list[float]) -> None:
        super().__init__()
        n = len(eigenvalues)
        basis, _ = torch.linalg.qr(torch.randn(n, n, generator=torch.Generator().manual_seed(0)))
        self.register_buffer("hessian", basis @ torch.diag(torch.tensor(eigenvalues)) @ basis.T)
        self.x = nn.Parameter(torch.ones(n))

    def forward(self) -> torch.Tensor:
        return 0.5 * self.x @ self.hessian @ self.x


def test_sharpness_of_a_quadratic_is_its_top_eigenvalue():
    model = Quadratic([7.0, 2.0, 1.0, 0.5, -0.25])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    config = ProbeConfig(sharpness_every=2, sharpness_iters=40)
    probe = Probe(model, optimizer, config, loss_closure=model)
    records = loss_steps(model, optimizer, probe, 3)
    assert records[0]["sharpness"] == pytest.approx(7.0, rel=1e-5)
    assert records[0]["sharpness_lr"] == pytest.approx(0.7, rel=1e-5)
    assert math.isnan(records[1]["sharpness"])
    assert records[2]["sharpness"] == pytest.approx(7.0, rel=1e-5)


def test_sharpness_defaults_to_the_probe_batch_loss():
    model = tiny_gpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = Probe(model, optimizer, ProbeConfig(sharpness_every=1, sharpness_iters=3))
    records = train(model, optimizer, token_batches(2), probe)
    assert all(math.isfinite(r["sharpness"]) for r in records)


def test_sharpness_without_a_loss_is_nan_with_one_warning():
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = Probe(model, optimizer, ProbeConfig(sharpness_every=1, sharpness_iters=2))
    with pytest.warns(RuntimeWarning, match="loss_closure"):
        for _ in range(2):
            loss = model(torch.randn(4, 3)).square().mean()
            loss.backward()
            probe.after_backward(loss)
            optimizer.step()
            assert math.isnan(probe.after_step()["sharpness"])


def test_the_old_name_sharpness_closure_still_works_and_says_it_is_deprecated():
    model = Quadratic([7.0, 2.0])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    config = ProbeConfig(sharpness_every=1, sharpness_iters=40)
    with pytest.warns(DeprecationWarning, match="now loss_closure"):
        probe = Probe(model, optimizer, config, sharpness_closure=model)
    assert probe.loss_closure is model
    assert loss_steps(model, optimizer, probe, 1)[0]["sharpness"] == pytest.approx(7.0, rel=1e-5)
    with pytest.warns(DeprecationWarning, match="now loss_closure"):
        probe.sharpness_closure = None
    assert probe.loss_closure is None
    with pytest.warns(DeprecationWarning), pytest.raises(TypeError, match="pass loss_closure"):
        Probe(model, optimizer, config, loss_closure=model, sharpness_closure=model)
