"""Parameter snapshots for the integration tests, and what a forced-rescue drill must show
under either framework (a module name no other test folder has)."""

from __future__ import annotations

import pytest
import torch

from collapse_guard.runfiles import read_run

__all__ = ["check_forced_rescue", "same", "snapshot"]


def snapshot(module: torch.nn.Module) -> list[torch.Tensor]:
    """Copies of the module's parameters, to compare across a step."""
    return [p.detach().clone() for p in module.parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def check_forced_rescue(drill, guard, lr: float) -> None:
    """The drill of checkpoints at steps 1 and 2 and a rescue forced at step 4 (two batches
    skipped, the LR halved), trained at ``lr``: what the parameters and the run file show."""
    # the rollback: the mean of the two checkpoints (the parameters after steps 1 and 2)
    for got, a, b in zip(drill.after[4], drill.after[1], drill.after[2], strict=True):
        torch.testing.assert_close(got, (a + b) / 2)
    assert same(drill.before[5], drill.after[6])  # the next two batches: no update
    assert not same(drill.before[7], drill.after[7])
    frame, meta = read_run(guard.run_path)
    assert frame["step"].tolist() == [0, 1, 2, 3, 4, 5, 6]  # skipped batches are not steps
    events = frame["event"].iloc[4].split(";")
    assert events[0] == "rescue:forced" and any(e.startswith("rollback:avg2@") for e in events)
    assert "skip_batches:2" in events
    assert frame["lr"].iloc[3] == pytest.approx(lr)
    assert frame["lr"].iloc[5] == pytest.approx(lr * 0.5)  # the rescue's 0.5
    assert meta.extra["guard"]["rescues"] == 1
    assert (guard.folder / "forensics").is_dir()
