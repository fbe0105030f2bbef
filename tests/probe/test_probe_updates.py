"""Update group: consecutive cosines, flip counts and ratios on constructed updates."""

from __future__ import annotations

import math

import pytest
import torch
from probe_models import Vector, loss_steps, tiny_gpt, token_batches, train

from collapse_guard.probe import Probe, ProbeConfig


def _run(model: Vector, directions: list[torch.Tensor], lr: float = 0.5, config=None) -> list:
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    probe = Probe(model, optimizer, config)
    steps = iter(directions)
    return loss_steps(lambda: model(next(steps)), optimizer, probe, len(directions))


def test_identical_consecutive_updates_have_cosine_one():
    direction = torch.tensor([[1.0, -2.0, 0.5, 4.0], [3.0, 1.0, -1.0, 2.0]])
    records = _run(Vector(8), [direction] * 4)
    assert math.isnan(records[0]["update_cos"])  # no previous update yet
    for record in records[1:]:
        assert record["update_cos"] == pytest.approx(1.0, abs=1e-6)
        assert record["update_flips"] == 0.0


def test_alternating_gradient_flips_every_step_up_to_the_window():
    direction = torch.ones(2, 4)
    signs = [(-1.0) ** t for t in range(14)]
    records = _run(Vector(8), [s * direction for s in signs])
    assert [r["update_flips"] for r in records] == [float(min(t, 10)) for t in range(14)]
    assert all(r["update_cos"] == pytest.approx(-1.0, abs=1e-6) for r in records[1:])


def test_flip_window_is_configurable_and_flips_decay_once_steady():
    direction = torch.ones(2, 4)
    directions = [direction, -direction, direction, direction, direction, direction]
    records = _run(Vector(8), directions, config=ProbeConfig(flip_window=3))
    assert [r["update_flips"] for r in records] == [0.0, 1.0, 2.0, 2.0, 1.0, 0.0]


def test_update_ratio_and_param_norm_are_exact_when_the_sketch_covers_the_tensor():
    direction = torch.tensor([[1.0, 2.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    records = _run(Vector(8), [direction, direction], lr=1.0)
    # after step 0: w = -d, update -d: ratio 1; after step 1: w = -2d, update -d: ratio 1/2
    assert records[0]["update_ratio"] == pytest.approx(1.0)
    assert records[1]["update_ratio"] == pytest.approx(0.5)
    assert records[1]["param_norm"] == pytest.approx(2 * 3.0)


def test_a_skipped_step_is_not_an_update():
    direction = torch.ones(2, 4)
    records = _run(Vector(8), [direction, 0 * direction, direction])
    assert math.isnan(records[1]["update_cos"])  # zero update: undefined, not 0
    assert records[2]["update_cos"] == pytest.approx(1.0, abs=1e-6)  # compared to step 0


def test_sketch_does_not_consume_the_global_rng_and_samples_large_tensors():
    model = tiny_gpt()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    probe = Probe(model, optimizer, ProbeConfig(sketch_size=16))
    batches = token_batches(3)
    state = torch.get_rng_state()
    records = train(model, optimizer, batches, probe)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(0.0 < r["update_ratio"] < 1.0 for r in records)
    assert -1.0 <= records[2]["update_cos"] <= 1.0
