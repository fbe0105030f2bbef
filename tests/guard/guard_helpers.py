"""A tiny seeded decoder and its loop, shared by the guard's tests."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from collapse_guard.datasets.real.models.gpt import GPT, GPTConfig

__all__ = ["Loop", "ddp_guarded", "nan_weight_run", "tiny_model"]

VOCAB, SEQ = 32, 16


def tiny_model(seed: int = 0, lr: float = 3e-3) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A 1-layer, 32-wide GPT (about 15k parameters) and its AdamW."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=VOCAB, seq_len=SEQ, n_layer=1, n_head=2, d_model=32))
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


class Loop:
    """Seeded batches of a learnable sequence (token t+1 = token t + 1 mod VOCAB, noisy)."""

    def __init__(self, seed: int = 0, batch: int = 8) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.batch = batch

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        start = torch.randint(0, VOCAB, (self.batch, 1), generator=self.generator)
        tokens = (start + torch.arange(SEQ + 1)) % VOCAB
        noise = torch.rand(tokens.shape, generator=self.generator) < 0.1
        random = torch.randint(0, VOCAB, tokens.shape, generator=self.generator)
        tokens = torch.where(noise, random, tokens)
        return tokens[:, :-1], tokens[:, 1:]

    def loss(self, model: torch.nn.Module) -> torch.Tensor:
        x, y = self.next()
        _, loss = model(x, y)
        loss.backward()
        return loss


def nan_weight_run(model, optimizer, folder, steps: int = 100) -> tuple[list[int], list]:
    """A guarded run of ``model`` (from ``tiny_model(seed=1)``) whose head weight turns NaN
    at step 90, so every loss is NaN and the guard rescues at 92: the steps rescued, and
    every warning given."""
    from collapse_guard.guard import Guard

    loop = Loop(seed=1)
    guard = Guard(model, optimizer, folder, risk="off", policy={"checkpoint_every": 20})
    rescues = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(steps):
            if step == 90:
                with torch.no_grad():
                    model.head.weight[0, 0] = float("nan")
            rescues += [step] if guard.step(loop.loss(model)).rescue else []
            optimizer.zero_grad()
    guard.close()
    return rescues, list(caught)


@contextmanager
def ddp_guarded(
    rank: int, world: int, folder: str, lr: float, config: dict | None = None
) -> Iterator:
    """One rank of a DDP test: its gloo group, the tiny model (same init on every rank, as
    DDP requires) wrapped in DDP with AdamW, its own data (``Loop`` seeded 100 + rank) and a
    Guard with the risk off; yields ``(model, ddp_model, optimizer, loop, guard)`` and
    destroys the group on exit."""
    import torch.distributed as dist

    from collapse_guard.guard import Guard

    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    torch.set_num_threads(1)
    init = f"file://{os.path.join(folder, 'rendezvous')}"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        model, _ = tiny_model(seed=0)
        ddp_model = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.AdamW(ddp_model.parameters(), lr=lr)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            guard = Guard(
                ddp_model, optimizer, os.path.join(folder, "ckpt"), risk="off", policy=config
            )
        yield model, ddp_model, optimizer, Loop(seed=100 + rank), guard
    finally:
        dist.destroy_process_group()
