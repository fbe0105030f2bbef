"""One rank of the QK-clip DDP test (spawned; module-level so spawn can import it)."""

from __future__ import annotations

import os
import warnings

import torch
import torch.distributed as dist

__all__ = ["STEPS", "run_rank"]

STEPS = 22  # probe passes at 0, 10, 20: clips applied after the updates of 1, 11, 21


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
        optimizer = torch.optim.AdamW(ddp_model.parameters(), lr=1e-2)
        # each rank its own data, so its own probe batch and its own head maxima: only
        # rank 0's plan, shared, keeps the ranks' weights equal
        loop = Loop(seed=100 + rank)
        config = {"qk_clip": "always", "qk_clip_tau": 0.01}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            guard = Guard(ddp_model, optimizer, os.path.join(folder, "ckpt"), risk="off",
                          config=config)  # fmt: skip
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
    finally:
        dist.destroy_process_group()
