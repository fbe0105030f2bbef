"""A guard whose rules are all quiet changes nothing: the plain loop's run, bit for bit.

Not a run one rounding away: two trajectories of a small model that part at the last bit
end 0.02-0.05 nats apart after 600 steps (benchmarks/README.md, "Guard rescue, per
configuration"), so a clip factor that rounds differently from torch's made every guarded
run differ from its unguarded twin by that much, for nothing the guard did.
"""

from __future__ import annotations

import pytest
import torch
from guard_helpers import Loop, tiny_model

from collapse_guard.guard import Guard

STEPS = 40
CLIP = 0.05  # under the tiny model's gradient norm: the clip acts at most steps
QUIET = {"clip": CLIP, "qk_clip": "off", "outlier_z": 1e9, "checkpoint_every": 1000}


def _optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=3e-3, fused=True)  # deferrable


def _plain_run() -> tuple[torch.nn.Module, list[float], int]:
    model, _ = tiny_model()
    optimizer, loop, losses, clipped = _optimizer(model), Loop(), [], 0
    for _ in range(STEPS):
        loss = loop.loss(model)
        clipped += int(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP) > CLIP)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return model, losses, clipped


@pytest.mark.parametrize("sync", ["step", "deferred"])
def test_a_quiet_guard_trains_the_plain_loops_run_bit_for_bit(tmp_path, sync):
    plain, plain_losses, clipped = _plain_run()
    model, _ = tiny_model()
    optimizer, loop, losses = _optimizer(model), Loop(), []
    guard = Guard(model, optimizer, tmp_path, risk="off", policy=QUIET, sync=sync, preflight=False)
    for _ in range(STEPS):
        loss = loop.loss(model)
        guard.step(loss)
        optimizer.zero_grad()
        losses.append(loss.item())
    summary = guard.summary()
    guard.close()
    assert clipped >= STEPS // 2, clipped  # the clip's factor is what is compared
    assert summary["skipped"] == 0 and summary["rescues"] == 0, summary
    assert losses == plain_losses
    for ours, theirs in zip(model.parameters(), plain.parameters(), strict=True):
        assert torch.equal(ours, theirs)
