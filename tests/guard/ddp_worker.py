"""One rank of the guard's DDP test (spawned; module-level so spawn can import it)."""

from __future__ import annotations

import os
import warnings

import torch
import torch.distributed as dist

__all__ = ["FORCED", "run_rank"]

FORCED = {12: "skip", 14: "rescue"}  # step -> action rank 0 is told to take
STEPS = 18


def run_rank(rank: int, world: int, folder: str) -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    torch.set_num_threads(1)
    init = f"file://{os.path.join(folder, 'rendezvous')}"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        from guard_helpers import Loop, tiny_model

        from collapse_guard.guard import Guard

        model, _ = tiny_model(seed=0)  # same init on every rank, as DDP requires
        ddp_model = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.AdamW(ddp_model.parameters(), lr=3e-3)
        loop = Loop(seed=100 + rank)  # each rank its own data
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            guard = Guard(ddp_model, optimizer, os.path.join(folder, "ckpt"), risk="off")
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
    finally:
        dist.destroy_process_group()
