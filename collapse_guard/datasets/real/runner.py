"""One real run: train a small decoder with the probe recording, label it, write it.

The loop is nanoGPT's, with the fault hooks and the probe in their places::

    for step in range(steps):
        lr = schedule(step) * fault LR multiplier     # set on every param group
        x, y = batch (or random tokens: corrupt_batch, corrupt_ramp)
        loss = model(x, y); loss.backward()
        <grad_spike scales the gradients>
        probe.after_backward(loss)                    # gradients before clipping
        clip (unless grad_clip == 0)
        <opt_reset wipes the second moments>
        optimizer.step(); probe.after_step()          # one row of the run file

A finished run file appears only by rename: the probe records into ``<name>.tmp``,
which is then labelled and renamed, so a crash leaves a temp file that a resumed
generation redoes, never a half run that looks finished.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from collapse_guard.datasets.real.config import RealRunConfig
from collapse_guard.datasets.real.data import BatchSource
from collapse_guard.datasets.real.faults import FaultInjector
from collapse_guard.datasets.real.onset import onset_kind
from collapse_guard.datasets.real.precision import emulate_precision

__all__ = [
    "NONFINITE_PATIENCE",
    "RunResult",
    "build",
    "collapse_cause",
    "run_real",
    "temp_path",
    "train",
]

NONFINITE_PATIENCE = 10  # consecutive non-finite losses after which a run is stopped: the
# weights are NaN by then and every later step would only repeat it

ENTROPY_COLLAPSED = 0.1  # nats: a head whose attention entropy is below this looks at one token


@dataclass(frozen=True)
class RunResult:
    """What one run produced (also what a pool worker sends back)."""

    run_id: str
    path: Path
    onset_step: int | None  # the label's onset, None for a healthy run
    kind: str | None  # the label's kind ("nonfinite", "loss_rise", ...)
    cause: str | None  # collapse_cause(): which mechanism most likely did it
    steps_run: int  # fewer than config.steps when a non-finite run was stopped
    seconds: float  # wall time of the whole run, training and writing
    onset_kind: str | None = None  # onset.onset_kind(): "sudden", "develops" or None


def temp_path(path: Path) -> Path:
    """Where a run is recorded before it is finished (not matched by ``*.parquet``)."""
    return path.with_name(path.name + ".tmp")


def build(config: RealRunConfig):
    """Seeded model of ``config.family`` and its optimizer (``optim.build_optimizer``)."""
    import torch

    from collapse_guard.datasets.real.models import build_model
    from collapse_guard.datasets.real.optim import build_optimizer

    torch.manual_seed(config.seed)
    model = build_model(config.family, config.model_config())
    emulate_precision(model, config.precision)
    return model, build_optimizer(config, model)


def train(config: RealRunConfig, model, optimizer, probe) -> int:
    """Train ``config.steps`` steps, calling ``probe`` in its places; return the steps run.

    ``probe`` is anything with ``after_backward(loss)`` and ``after_step()``: the
    project's :class:`collapse_guard.probe.Probe` in a real run.
    """
    import torch

    generator = torch.Generator().manual_seed(config.seed)
    batches = BatchSource(config, generator)
    faults = FaultInjector(config)
    nonfinite_streak = 0
    for step in range(config.steps):
        lr = config.lr_at(step) * faults.lr_multiplier(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = faults.batch(step, *batches.next(), generator)
        _, loss = model(x, y)
        loss.backward()
        faults.after_backward(step, model)
        probe.after_backward(loss)
        if config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        faults.before_step(step, optimizer)
        optimizer.step()
        probe.after_step()
        optimizer.zero_grad(set_to_none=True)
        nonfinite_streak = 0 if math.isfinite(loss.item()) else nonfinite_streak + 1
        if nonfinite_streak >= NONFINITE_PATIENCE:
            return step + 1
    return config.steps


def collapse_cause(config: RealRunConfig, label, frame) -> str | None:
    """Name the likely mechanism of a labelled collapse (None for a healthy run).

    ``fault_<kind>`` when the onset follows an injected fault; ``divergence`` for a
    non-finite loss; ``entropy_collapse`` when some head's attention went one-hot by
    the onset (Zhai et al. 2023); otherwise the label's own kind.
    """
    if label.onset_step is None:
        return None
    if config.fault != "none" and label.onset_step >= config.fault_step:
        return f"fault_{config.fault}"
    if label.kind == "nonfinite":
        return "divergence"
    entropy = frame.loc[frame["step"] <= label.onset_step + 50, "attn_entropy_min"].dropna()
    if len(entropy) and entropy.iloc[-1] < ENTROPY_COLLAPSED:
        return "entropy_collapse"
    return label.kind


def run_real(
    config: RealRunConfig, path: Path, run_id: str, *, loss_closure: Callable | None = None
) -> RunResult:
    """Train one run, record it with the probe, label it and write it to ``path``.

    ``loss_closure(model)``, if given, returns the loss the probe's line and sharpness
    groups read (``Probe(loss_closure=)``) instead of the probe batch's: the step's
    training batch, for one (``benchmarks/line_pilot.py``).
    """
    import torch

    from collapse_guard.probe import Probe, ProbeConfig
    from collapse_guard.probe.config import RECORDED_LINE_EVERY, RECORDED_OPTIMIZER_EVERY
    from collapse_guard.runfiles.format import RunMeta
    from collapse_guard.runfiles.label import apply_label, label_run
    from collapse_guard.runfiles.reader import read_run
    from collapse_guard.runfiles.writer import write_run

    began = time.perf_counter()
    path = Path(path)
    tmp = temp_path(path)
    model, optimizer = build(config)
    recorded = ProbeConfig(optimizer_every=RECORDED_OPTIMIZER_EVERY, line_every=RECORDED_LINE_EVERY)
    closure = loss_closure(model) if loss_closure is not None else None
    probe = Probe(model, optimizer, recorded, loss_closure=closure)
    probe.record_to(tmp, RunMeta(run_id=run_id, source="real", config=config.to_dict()))
    try:
        steps_run = train(config, model, optimizer, probe)
    finally:
        probe.close()
    frame, meta = read_run(tmp)
    label = label_run(frame)
    meta = apply_label(meta, label)
    cause = collapse_cause(config, label, frame)
    triggers = config.triggers()
    kind, gap = onset_kind(triggers, label.onset_step)
    seconds = time.perf_counter() - began
    meta.extra.update(
        collapse_cause=cause,
        triggers=triggers,
        onset_kind=kind,
        trigger_to_onset=gap,
        steps_run=steps_run,
        seconds=round(seconds, 2),
        torch_version=torch.__version__,
    )
    write_run(tmp, frame, meta, compact=True)  # the corpus pack: format.py, "compact"
    os.replace(tmp, path)  # the run exists, finished, or not at all
    return RunResult(
        run_id, path, label.onset_step, label.kind, cause, steps_run, seconds, onset_kind=kind
    )
