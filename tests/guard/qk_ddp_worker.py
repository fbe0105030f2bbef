"""One rank of the QK-clip DDP test (spawned; module-level so spawn can import it)."""

from __future__ import annotations

import os

import torch

__all__ = ["STEPS", "run_rank"]

STEPS = 22  # probe passes at 0, 10, 20: clips applied after the updates of 1, 11, 21


def run_rank(rank: int, world: int, folder: str) -> None:
    from guard_helpers import ddp_guarded

    # each rank its own data, so its own probe batch and its own head maxima: only rank 0's
    # plan, shared, keeps the ranks' weights equal
    config = {"qk_clip": "always", "qk_clip_tau": 0.01}
    with ddp_guarded(rank, world, folder, lr=1e-2, config=config) as (
        model,
        ddp_model,
        optimizer,
        loop,
        guard,
    ):
        for _ in range(STEPS):
            x, y = loop.next()
            _, loss = ddp_model(x, y)
            loss.backward()
            guard.step(loss)
            optimizer.zero_grad()
        guard.close()
        result = {
            "params": {n: p.detach().clone() for n, p in model.named_parameters()},
            "events": [f"{s}:{e}" for s, e in guard.events if e.startswith("qk_clip:")],
        }
        torch.save(result, os.path.join(folder, f"rank{rank}.pt"))
