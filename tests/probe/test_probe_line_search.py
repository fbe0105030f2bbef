"""The line group: the loss along the step just taken, against a quadratic whose answer is
known, and training left untouched."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from probe_models import loss_steps, scaled_records, tiny_gpt, token_batches, train
from torch import nn

from collapse_guard.datasets.real.config import RealRunConfig
from collapse_guard.datasets.real.optim import build_optimizer
from collapse_guard.probe import Probe, ProbeConfig
from collapse_guard.signals import SIGNALS

LINE_KEYS = ("line_edge", "line_descent", "line_double")


class Valley(nn.Module):
    """0.5 x^T H x with H = diag(eigenvalues); the start lies along the first axis."""

    def __init__(self, eigenvalues: list[float]) -> None:
        super().__init__()
        self.register_buffer("eigenvalues", torch.tensor(eigenvalues, dtype=torch.float64))
        start = torch.zeros(len(eigenvalues), dtype=torch.float64)
        start[0] = 1.0
        self.x = nn.Parameter(start)

    def forward(self) -> torch.Tensor:
        return 0.5 * (self.eigenvalues * self.x.square()).sum()


def _descend(lr: float, steps: int = 2) -> list[dict]:
    model = Valley([7.0, 1.0])
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    probe = Probe(model, optimizer, ProbeConfig(line_every=1), loss_closure=model)
    return loss_steps(model, optimizer, probe, steps)


@pytest.mark.parametrize("lr", [0.1, 0.3])
def test_on_a_quadratic_the_edge_is_lr_times_curvature_over_two(lr):
    """Gradient descent along an eigenvector of eigenvalue 7: c / |b| = lr x 7 / 2, the
    step realises 1 - that of its first-order decrease, a doubled one 2 - 4 x that."""
    edge = lr * 7.0 / 2
    for record in _descend(lr):
        assert record["line_edge"] == pytest.approx(edge, rel=1e-9)
        assert record["line_descent"] == pytest.approx(1 - edge, rel=1e-9)
        assert record["line_double"] == pytest.approx(2 - 4 * edge, rel=1e-9)
    beyond = _descend(0.3)[0]  # lr x 7 = 2.1: past gradient descent's edge (2)
    assert beyond["line_edge"] > 1 and beyond["line_descent"] < 0


def test_a_step_that_does_not_move_reads_nan():
    record = _descend(0.0, steps=1)[0]
    assert all(math.isnan(record[key]) for key in LINE_KEYS)


@pytest.mark.parametrize("every", [1, 3])
def test_only_due_steps_are_measured(every):
    model = tiny_gpt()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    probe = Probe(model, optimizer, ProbeConfig(line_every=every))
    records = train(model, optimizer, token_batches(4), probe)
    for step, record in enumerate(records):
        measured = [math.isfinite(record[key]) for key in LINE_KEYS]
        assert measured == [step % every == 0] * 3, (step, record)
    # a small AdamW step on a fresh model: the loss falls along it, well inside the edge
    assert 0.5 < records[0]["line_descent"] <= 1.1 and abs(records[0]["line_edge"]) < 0.5


@pytest.mark.parametrize("name", ["adamw", "lion", "muon"])
def test_training_is_bit_identical_with_and_without_the_group(name):
    config = RealRunConfig(optimizer=name, lr=0.01, warmup_steps=1)

    def run(every: int) -> tuple[dict, torch.Tensor]:
        model = tiny_gpt(dropout=0.1, seed=4)  # dropout: the probe's forwards must not draw
        optimizer = build_optimizer(config, model)
        probe = Probe(model, optimizer, ProbeConfig(line_every=every))
        train(model, optimizer, token_batches(4), probe)
        return model.state_dict(), torch.random.get_rng_state()

    (plain, plain_rng), (probed, probed_rng) = run(0), run(1)
    for (key, a), (_, b) in zip(plain.items(), probed.items(), strict=True):
        assert torch.equal(a, b), key
    assert torch.equal(plain_rng, probed_rng)


def test_a_model_without_a_loss_reads_nan_with_one_warning():
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = Probe(model, optimizer, ProbeConfig(line_every=1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = loss_steps(lambda: model(torch.randn(4, 3)).square().mean(), optimizer, probe, 3)
    assert all(math.isnan(r[key]) for r in records for key in LINE_KEYS)
    ours = [w for w in caught if "line_edge" in str(w.message)]
    assert len(ours) == 1 and "loss_closure" in str(ours[0].message)


def test_the_group_is_off_by_default_and_no_model_reads_it():
    from collapse_guard.predictor.training.data import MODEL_SIGNALS

    assert ProbeConfig().line_every == 0
    assert [s.name for s in SIGNALS if s.group == "line"] == list(LINE_KEYS)
    assert not set(LINE_KEYS) & set(MODEL_SIGNALS)


def test_under_a_grad_scaler_the_first_order_term_is_unscaled():
    """g . u from scaled gradients, unscaled: the readings match the plain loop's; a step
    the scaler skips (an infinite gradient) did not move, so it reads NaN."""

    config = ProbeConfig(line_every=1)
    plain = scaled_records(None, config)
    scaled = scaled_records(torch.amp.GradScaler("cpu", init_scale=1024.0), config)
    for key in LINE_KEYS:
        assert scaled[0][key] == pytest.approx(plain[0][key], rel=1e-4), key
    skipped = scaled_records(torch.amp.GradScaler("cpu", init_scale=1024.0), config, inf_at=1)[1]
    assert all(math.isnan(skipped[key]) for key in LINE_KEYS)
