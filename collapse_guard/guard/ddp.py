"""DDP: rank 0 decides, every rank applies the same decision.

The classic bug of a guard under data parallelism is ranks that decide apart: one skips
a batch the others train on, and their parameters drift for the rest of the run. Here
every rank gathers its own facts, but only rank 0's decision counts: it is broadcast
(``broadcast_object_list``: a small dataclass, one collective a step) and applied as is.
Rank 0 alone asks for the risk, writes checkpoints and the run file; a rollback names
its checkpoint files in the decision, and every rank loads those same files (a folder
every rank can read), then waits for the others before rank 0 may write again.
Without an initialised process group of two or more ranks every function is a no-op.
"""

from __future__ import annotations

from typing import TypeVar

import torch.distributed as dist

__all__ = ["barrier", "is_distributed", "rank", "share"]

T = TypeVar("T")


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def share(obj: T) -> T:
    """Rank 0's ``obj`` on every rank (returned as is without DDP)."""
    if not is_distributed():
        return obj
    box = [obj if rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if is_distributed():
        dist.barrier()
