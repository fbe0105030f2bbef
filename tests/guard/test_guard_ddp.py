"""DDP: two gloo processes on the CPU; rank 0 decides, both apply the same decision."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp


@pytest.mark.slow  # two spawned interpreters importing torch: ~40 s on the loaded machine
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed missing")
def test_a_forced_skip_and_rollback_leave_both_ranks_identical(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    from ddp_worker import FORCED, run_rank

    mp.start_processes(run_rank, args=(2, str(tmp_path)), nprocs=2, start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    for r in ranks:  # both ranks took rank 0's forced actions, and only those
        assert {s: a for s, a in r["taken"].items() if a} == FORCED
        assert r["skips"] == 20  # the rescue's batch skips, asked on each rank (none consumed)
    zero, one = (r["params"] for r in ranks)
    assert zero.keys() == one.keys()
    for name in zero:
        assert torch.equal(zero[name], one[name]), name
