"""One rank of the guard's DDP test (spawned; module-level so spawn can import it)."""

from __future__ import annotations

import os

import torch

__all__ = ["FORCED", "run_rank"]

FORCED = {12: "skip", 14: "rescue"}  # step -> action rank 0 is told to take
STEPS = 18


def run_rank(rank: int, world: int, folder: str) -> None:
    from guard_helpers import ddp_guarded

    with ddp_guarded(rank, world, folder, lr=3e-3) as (model, ddp_model, optimizer, loop, guard):
        taken = {}
        for step in range(STEPS):
            if rank == 0 and step in FORCED:  # only rank 0's wish counts
                guard.force_next(FORCED[step])
            x, y = loop.next()
            _, loss = ddp_model(x, y)
            loss.backward()
            decision = guard.step(loss)
            optimizer.zero_grad()
            taken[step] = "rescue" if decision.rescue else "skip" if decision.skipped else ""
        guard.close()
        state = {n: p.detach().clone() for n, p in model.named_parameters()}
        result = {"params": state, "taken": taken, "skips": guard.pending_skips}
        torch.save(result, os.path.join(folder, f"rank{rank}.pt"))
