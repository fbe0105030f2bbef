"""Tiny models and a loop for the probe's tests (each case small enough to reason exactly)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from collapse_guard.datasets.real.model import GPT, GPTConfig
from collapse_guard.probe import Probe


def tiny_gpt(dropout: float = 0.0, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(n_layer=2, n_head=2, d_model=16, seq_len=8, dropout=dropout))


def token_batches(n: int, batch: int = 4, seq: int = 8, seed: int = 1) -> list:
    generator = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randint(0, 256, (batch, seq), generator=generator),
            torch.randint(0, 256, (batch, seq), generator=generator),
        )
        for _ in range(n)
    ]


def probed_step(model, optimizer, batch, probe=None, *, before_step=None) -> tuple:
    """One step of the user's loop of docs/design.md's "Public API": ``(record, logits, loss)``.

    ``before_step()`` runs between ``after_backward`` and the optimizer step (where a
    loop clips). Gradients are left in place, for the test to read or zero.
    """
    x, y = batch
    logits, loss = model(x, y)
    loss.backward()
    if probe is not None:
        probe.after_backward(loss)
    if before_step is not None:
        before_step()
    optimizer.step()
    record = probe.after_step() if probe is not None else None
    return record, logits, loss


def train(model, optimizer, batches, probe=None) -> list[dict]:
    """The user's loop over ``batches``; returns the probe's records."""
    records = []
    for batch in batches:
        record, _, _ = probed_step(model, optimizer, batch, probe)
        if probe is not None:
            records.append(record)
        optimizer.zero_grad()
    return records


def loss_steps(make_loss, optimizer, probe, steps: int) -> list[dict]:
    """``steps`` steps of the user's loop on the loss ``make_loss()`` returns; the records."""
    records = []
    for _ in range(steps):
        loss = make_loss()
        loss.backward()
        probe.after_backward(loss)
        optimizer.step()
        records.append(probe.after_step())
        optimizer.zero_grad()
    return records


def scaled_records(scaler, config=None, inf_at: int | None = None, steps: int = 3) -> list[dict]:
    """The tiny GPT trained by SGD at 0.1 under an AMP ``scaler`` (None: the plain loop), an
    infinite gradient set at step ``inf_at``; the probe's records."""
    model = tiny_gpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = Probe(model, optimizer, config, scaler=scaler)
    records = []
    for step, (x, y) in enumerate(token_batches(steps)):
        _, loss = model(x, y)
        (scaler.scale(loss) if scaler else loss).backward()
        if step == inf_at:
            model.head.weight.grad[0, 0] = math.inf
        probe.after_backward(loss)
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        records.append(probe.after_step())
        optimizer.zero_grad()
    return records


class UniformAttention(nn.Module):
    """Zero queries: every query attends uniformly to all T keys (non-causal)."""

    def __init__(self, width: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.key = nn.Linear(width, width)
        self.value = nn.Linear(width, width)
        self.head = nn.Linear(width, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, seq, self.heads, width // self.heads).transpose(1, 2)

        k, v = split(self.key(x)), split(self.value(x))
        y = F.scaled_dot_product_attention(torch.zeros_like(k), k, v)
        return self.head(y.transpose(1, 2).reshape(batch, seq, width))


class MHAModel(nn.Module):
    """nn.MultiheadAttention called with its defaults (need_weights=True)."""

    def __init__(self, width: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.head = nn.Linear(width, 5)
        self.last_weights = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, self.last_weights = self.attn(x, x, x)
        return self.head(y)


class NoAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Layered(nn.Module):
    """``layers``: a ModuleList of 1x1 linear layers, so each layer's gradient is one number."""

    def __init__(self, n: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(1, 1, bias=False) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class Vector(nn.Module):
    """One 2-D parameter; the loss is linear in it, so the gradient is whatever we say."""

    def __init__(self, size: int = 8) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(2, size // 2))

    def forward(self, direction: torch.Tensor) -> torch.Tensor:
        return (self.w * direction).sum()
