"""Runs as a user's own loop leaves them: written with no label, importable as ``recorded_runs``.

``write_unlabelled_run``: a run file written row by row with the ``RunWriter`` (no torch), a
loss that falls, then (``collapse_at``) rises 0.02 nats a step and stays up: a collapse the
label finds a few steps after ``collapse_at``. ``record_probe_run``: a real tiny GPT trained
by a plain loop with ``Probe.record_to``, into the demo's collapse (a Lion re-warm), which
the bundled model warns of before the onset.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["record_probe_run", "write_unlabelled_run"]


def write_unlabelled_run(
    path: Path, run_id: str, *, collapse_at: int | None = 400, steps: int = 600, seed: int = 0
) -> Path:
    """A run file with ``step``, ``loss``, ``grad_norm`` and ``lr`` and no label in its meta."""
    from collapse_guard.runfiles import RunMeta, RunWriter

    rng = np.random.default_rng(seed)
    with RunWriter(path, RunMeta(run_id=run_id, source="real")) as writer:
        for step in range(steps):
            loss = 2.0 + 3.0 * np.exp(-step / 100) + 0.02 * rng.standard_normal()
            if collapse_at is not None and step >= collapse_at:
                loss += 0.02 * (step - collapse_at)
            writer.append(step, {"loss": loss, "grad_norm": 1.0, "lr": 1e-3})
    return path


def record_probe_run(path: Path, run_id: str, steps: int = 360) -> Path:
    """The demo's unguarded scenario cut to ``steps`` steps (it collapses near step 300,
    after a re-warm from step 200), trained by a loop of the user's kind and recorded by
    ``Probe.record_to``: no label in the file. ~15 s on one busy core."""
    import torch

    from collapse_guard.datasets.real.data import BatchSource
    from collapse_guard.datasets.real.runner import build
    from collapse_guard.demo import DEFAULT, scenario
    from collapse_guard.probe import Probe
    from collapse_guard.runfiles import RunMeta

    config = scenario(**{**DEFAULT, "steps": steps})
    model, optimizer = build(config)
    batches = BatchSource(config, torch.Generator().manual_seed(config.seed))
    probe = Probe(model, optimizer)
    probe.record_to(path, RunMeta(run_id=run_id, source="real"))
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = config.lr_at(step)
        _, loss = model(*batches.next())
        loss.backward()
        probe.after_backward(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        probe.after_step()
        optimizer.zero_grad(set_to_none=True)
    probe.close()
    return path
