"""A model under ``torch.compile`` stays compiled under the guard: the probe's passes (eval
mode, no grad, hooks on every module) run eagerly (``probe.capture.isolated``), so they fail
no guard of the training graph and never push dynamo to its recompile limit, past which the
user's training forward would run eager for the rest of the run."""

from __future__ import annotations

import math

import pytest
import torch
from guard_helpers import Loop, tiny_model

from collapse_guard.guard import Guard
from collapse_guard.runfiles import read_run

pytestmark = pytest.mark.skipif(
    not hasattr(torch.compiler, "set_stance"), reason="torch.compiler.set_stance: torch >= 2.6"
)


@pytest.mark.parametrize("given", ["compiled", "plain"])
def test_the_guards_probe_passes_recompile_nothing(tmp_path, given):
    """The guard given the compiled module, or the module it wraps (the loop trains the
    compiled one either way)."""
    model, optimizer = tiny_model()
    compiled = torch.compile(model, backend="eager")  # dynamo's guards, no code generation
    watched = compiled if given == "compiled" else model
    guard, loop = Guard(watched, optimizer, tmp_path, risk="off"), Loop()

    def step() -> None:
        x, y = loop.next()
        _, loss = compiled(x, y)
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad()

    for _ in range(3):  # the first compile, and the probe's batch capture leaving its hook
        step()
    with torch.compiler.set_stance("fail_on_recompile"):  # a recompile raises
        for _ in range(60):  # six probe passes (attention every 10 steps)
            step()
    guard.close()
    frame, _ = read_run(guard.run_path)
    probed = frame["attn_logit_max"].dropna()
    assert len(probed) >= 6 and all(math.isfinite(v) and v > 0 for v in probed)
