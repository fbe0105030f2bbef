"""Gradient group: exact values on constructed gradients, and block discovery."""

from __future__ import annotations

import math

import pytest
import torch
from probe_models import Layered, probed_step, tiny_gpt, token_batches, train
from torch import nn

from collapse_guard.probe import Probe
from collapse_guard.probe.layout import find_blocks


def _set_grads_and_measure(model: nn.Module, grads: list[float]) -> dict[str, float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    probe = Probe(model, optimizer)
    for layer, value in zip(model.layers, grads, strict=True):
        layer.weight.grad = torch.full_like(layer.weight, value)
    probe.after_backward(torch.tensor(1.0))
    optimizer.step()
    return probe.after_step()


def test_grad_cv_is_std_over_mean_of_per_layer_norms():
    record = _set_grads_and_measure(Layered(4), [1.0, -2.0, 3.0, 4.0])
    norms = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    expected = (norms.std(correction=0) / norms.mean()).item()  # sqrt(1.25) / 2.5
    assert record["grad_cv"] == pytest.approx(expected, rel=1e-6)
    assert record["grad_norm"] == pytest.approx(math.sqrt(1 + 4 + 9 + 16), rel=1e-6)
    assert record["bottom_grad_norm"] == pytest.approx(1.0, rel=1e-6)
    assert record["grad_nonfinite"] == 0.0


def test_a_float64_model_is_measured():
    record = _set_grads_and_measure(Layered(4).double(), [1.0, -2.0, 3.0, 4.0])
    assert record["grad_norm"] == pytest.approx(math.sqrt(1 + 4 + 9 + 16), rel=1e-6)
    assert record["grad_cv"] == pytest.approx(math.sqrt(1.25) / 2.5, rel=1e-6)


def test_equal_layer_norms_give_zero_cv_and_nonfinite_are_counted():
    assert _set_grads_and_measure(Layered(3), [2.0, -2.0, 2.0])["grad_cv"] == 0.0
    record = _set_grads_and_measure(Layered(3), [math.inf, math.nan, 1.0])
    assert record["grad_nonfinite"] == 2.0 and not math.isfinite(record["grad_norm"])


def test_frozen_bottom_block_has_zero_gradient_norm():
    model = tiny_gpt()
    for p in model.blocks[0].parameters():
        p.requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    record = train(model, optimizer, token_batches(1), Probe(model, optimizer))[0]
    assert record["bottom_grad_norm"] == 0.0
    assert record["grad_norm"] > 0


def test_grad_norm_matches_clip_grad_norm_and_is_read_before_clipping():
    model = tiny_gpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    norms = []  # clip_grad_norm_ returns the norm before clipping

    def clip() -> None:
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1e-3))

    probe = Probe(model, optimizer)
    record, _, _ = probed_step(model, optimizer, token_batches(1)[0], probe, before_step=clip)
    total = norms[0]
    assert record["grad_norm"] == pytest.approx(total.item(), rel=1e-5)
    bottom = torch.stack([p.grad.norm() for p in model.blocks[0].parameters()]).norm()
    assert bottom.item() < total.item()  # sanity: the block is part of the whole


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda: tiny_gpt(), lambda m: m.blocks),
        (
            lambda: nn.TransformerEncoder(
                nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), num_layers=3
            ),
            lambda m: m.layers,
        ),
        (lambda: nn.Sequential(nn.Embedding(5, 4), Layered(3)), lambda m: m[1].layers),
    ],
)
def test_blocks_are_found_in_common_layouts(build, expected):
    model = build()
    assert find_blocks(model) == tuple(expected(model))


def test_gpt2_style_h_and_no_blocks():
    class GPT2Like(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.transformer = nn.Module()
            self.transformer.h = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))
            self.lm_head = nn.Linear(4, 4)

    model = GPT2Like()
    assert find_blocks(model) == tuple(model.transformer.h)
    assert find_blocks(nn.Linear(3, 3)) == ()
