"""``collapse-guard demo``: the same seeded small transformer trained twice, unguarded and
guarded, into a collapse that develops over a hundred steps and more.

The scenario is the real-run sampler's ``slow_ramp`` recipe (``datasets/real/sampler.py``):
a GPT (2 layers, d_model 64, no qk-layernorm) learns at a safe LR with Lion, then the LR is
re-warmed slowly, over ``--rewarm-steps`` steps, to several times Lion's measured stable
edge (``STABLE_EDGE``: 0.03), as a continued pre-training that re-warms too far does. Lion
is the default because slow re-warms under Lion are the collapses the bundled model
forecasts best on families it never saw (benchmarks/README.md); under AdamW
(``--optimizer adamw --lr 0.003 --rewarm-lr 0.16``) it gives no warning, and the save is
the guard's reactive path's. The
unguarded run's loss rises and stays up (the project's label calls it a collapse); the
guarded run sees the risk rise, lowers its LR and tightens clipping, and rolls back and
lowers the LR again if the loss still rises, and finishes healthy. Both runs are scored by
the bundled default model every 10 steps (the guard's own cadence), so the table can give
the unguarded run's first warning and its lead over the collapse.

Printed: a table (final loss, collapse step, first warning and its lead, actions, wall
time); written: a plot of loss and risk for both runs with the guard's actions marked,
and the guarded run's run file, checkpoints and forensics under ``--out``. torch is
imported when the command runs, so that ``collapse-guard --help`` stays fast.
"""

from __future__ import annotations

import enum
import math
import os
import platform
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer

from collapse_guard.datasets.real.config import OPTIMIZERS

__all__ = [
    "DEFAULT",
    "PINNED_KERNELS",
    "DemoRun",
    "demo",
    "pinned_kernels",
    "run_scenario",
    "scenario",
]

Optimizer = enum.Enum("Optimizer", {name: name for name in OPTIMIZERS}, type=str)  # the choices
# the demo's scenario (``scenario``'s arguments): a Lion re-warm over 400 steps to 3.3x the
# edge, which the bundled model warns of 50+ steps before the collapse (tests/test_command_line).
# 800 steps, not 700: the guarded run, held at warn and released as the risk dips, creeps
# back past the edge; on a Zen 5 its loss rose from step 640 and the rescue came at 700, the
# 700-step demo's last (docs/guard.md, "The demo's figures on other CPUs")
DEFAULT = {
    "steps": 800,
    "optimizer": "lion",
    "lr": 4e-3,
    "rewarm_at": 200,
    "rewarm_steps": 400,
    "rewarm_lr": 0.1,
    "batch_size": 8,
    "seed": 0,
}
RISK_EVERY = 10  # steps between risk readings of the unguarded run: the guard's default
# The figures depend on the CPU's kernels (Lion's sign updates amplify a rounding): on one
# AMD EPYC, torch's AVX2 kernels instead of its portable ones moved the unguarded final loss
# from 26.7 to 20.7 and the first warning from 249 to 259. MKL_CBWR=AVX2 is no pin on a
# non-Intel CPU (MKL falls back to its AUTO branch there, not promised to repeat on another
# CPU model: two EPYCs printed collapse 301 and 296); COMPATIBLE is the one MKL branch that is
# the same on every x86-64 CPU, and torch's "default" kernels are the same compiled code on
# every one. So the demo runs both on x86-64; a user's own setting wins.
PINNED_KERNELS = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}
FINAL_STEPS = 20  # the final loss is the mean of the last 20 steps' losses


@dataclass
class DemoRun:
    """What one run of the demo produced."""

    name: str
    losses: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    risk: dict[int, float] = field(default_factory=dict)  # step -> P(collapse)
    events: list[tuple[int, str]] = field(default_factory=list)
    first_warning: int | None = None
    onset: int | None = None  # the label's collapse step
    kind: str | None = None
    gave_up: bool = False  # the guard stopped the run (GuardGaveUp) before its last step
    seconds: float = 0.0

    @property
    def final_loss(self) -> float:
        tail = [x for x in self.losses[-FINAL_STEPS:] if math.isfinite(x)]
        return sum(tail) / len(tail) if tail else math.nan

    def actions(self) -> Counter:
        """How many times the guard did each thing (a rescue's parts counted once; a
        ``qk_clip`` is one head's)."""
        kinds = ("rescue", "skip", "checkpoint", "clip_layers", "qk_clip")
        return Counter(k for _, e in self.events if (k := e.split(":")[0]) in kinds)


def scenario(steps: int, lr: float, rewarm_at: int, rewarm_steps: int, rewarm_lr: float, **kw):
    """The demo's ``RealRunConfig``: warmup to ``lr``, held, re-warmed slowly to ``rewarm_lr``."""
    from collapse_guard.datasets.real.config import RealRunConfig

    return RealRunConfig(
        recipe="slow_ramp",
        steps=steps,
        lr=lr,
        warmup_steps=max(1, min(40, steps // 10)),
        min_lr_ratio=1.0,  # hold the peak: the LR change the run sees is the re-warm
        rewarm_step=rewarm_at if 0 < rewarm_at < steps else 0,
        rewarm_steps=max(1, rewarm_steps),
        rewarm_lr=rewarm_lr,
        **kw,
    )


def run_scenario(
    config, model, guarded: bool, out: Path | None = None, policy: Mapping | None = None
) -> DemoRun:
    """Train ``config`` once, nanoGPT's way (the loop sets the LR every step), with its
    fault if it has one (``datasets/real/faults.py``, hooked where ``runner.train`` does);
    ``policy``: ``GuardPolicy`` fields over the demo's own (benchmarks/guard_rescue.py)."""
    import torch

    from collapse_guard.datasets.real.data import BatchSource
    from collapse_guard.datasets.real.faults import FaultInjector
    from collapse_guard.datasets.real.runner import build
    from collapse_guard.features import RunContext
    from collapse_guard.guard import Guard, GuardGaveUp, GuardPolicy
    from collapse_guard.predictor.core.hold import hold_risk
    from collapse_guard.predictor.core.levels import WARN
    from collapse_guard.probe import Probe
    from collapse_guard.runfiles.label import label_run

    run = DemoRun("guarded" if guarded else "unguarded")
    net, optimizer = build(config)
    generator = torch.Generator().manual_seed(config.seed)
    batches, faults = BatchSource(config, generator), FaultInjector(config)
    began = time.perf_counter()
    if guarded:
        settings = GuardPolicy(clip=config.grad_clip, risk_every=RISK_EVERY, **(policy or {}))
        guard = Guard(net, optimizer, out, risk=model, policy=settings, preflight=False)
    else:
        probe = Probe(net, optimizer)
        context, rows = RunContext.from_schema(model.schema), []
    for step in range(config.steps):
        while guarded and guard.should_skip_batch():  # the data that led to a rescue
            batches.next()
        for group in optimizer.param_groups:
            group["lr"] = config.lr_at(step) * faults.lr_multiplier(step)
        _, loss = net(*faults.batch(step, *batches.next(), generator))
        loss.backward()
        faults.after_backward(step, net)  # the fault hooks of runner.train, in its order
        faults.before_step(step, optimizer)
        if guarded:
            try:
                guard.step(loss)
            except GuardGaveUp:  # the guard closed itself: the run ends here, unrescued
                run.gave_up = True
                run.losses.append(loss.item())
                break
            run.lrs.append(guard.lr_in_force)
        else:
            probe.after_backward(loss)
            torch.nn.utils.clip_grad_norm_(net.parameters(), config.grad_clip)
            optimizer.step()
            record = probe.after_step()
            rows.append(record)
            context.update(step, record)
            if (step + 1) % RISK_EVERY == 0:
                tail = rows[-model.schema.window :]
                window = _frame(tail, step + 1 - len(tail))
                run.risk[step] = model.predict_window(window, context=context.get())
            run.lrs.append(record["lr"])
        optimizer.zero_grad(set_to_none=True)
        run.losses.append(loss.item())
    if guarded:
        guard.close()
        run.events, run.first_warning = list(guard.events), guard.first_warning
        run.risk = dict(guard.risk_readings)
    else:
        probe.close()
        steps = sorted(run.risk)
        held = hold_risk(steps, [run.risk[s] for s in steps], model.hold_steps)
        run.risk = dict(zip(steps, held.tolist(), strict=True))  # as the guard holds it
        warn = model.thresholds[WARN]
        run.first_warning = next((s for s, p in run.risk.items() if p >= warn), None)
    run.seconds = time.perf_counter() - began
    label = label_run(_frame([{"loss": x} for x in run.losses], 0))
    run.onset, run.kind = label.onset_step, label.kind
    return run


def _frame(records: list[dict[str, float]], first: int):
    import pandas as pd

    return pd.DataFrame(records).assign(step=range(first, first + len(records)))


def _table(runs: list[DemoRun], title: str):
    from rich.table import Table

    table = Table(title=title)
    for header in (
        "run",
        "final loss",
        "collapse step",
        "first warning (lead)",
        "actions",
        "wall s",
    ):
        table.add_column(header, justify="right" if header != "actions" else "left")
    for run in runs:
        lead = ""
        if run.first_warning is not None and run.onset is not None:
            lead = f" ({run.onset - run.first_warning:+d})"
        warning = "-" if run.first_warning is None else f"{run.first_warning}{lead}"
        actions = ", ".join(f"{n} {k}" for k, n in sorted(run.actions().items())) or "-"
        collapse = "-" if run.onset is None else f"{run.onset} ({run.kind})"
        table.add_row(
            run.name, f"{run.final_loss:.3f}", collapse, warning, actions, f"{run.seconds:.1f}"
        )
    return table


def plot(runs: list[DemoRun], thresholds: dict[str, float], path: Path) -> Path:
    """Loss and risk over steps for both runs; the guard's rescues and checkpoints marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from collapse_guard.runfiles.label import HORIZON

    fig, (top, mid, low) = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    colors = {"unguarded": "tab:red", "guarded": "tab:blue"}
    for run in runs:
        color = colors[run.name]
        top.plot(run.losses, color=color, lw=0.8, label=run.name)
        mid.semilogy(run.lrs, color=color, lw=0.8)
        steps = sorted(run.risk)
        low.plot(steps, [run.risk[s] for s in steps], color=color, lw=1, label=run.name)
        if run.onset is not None:
            for ax in (top, low):
                ax.axvline(run.onset, color=color, ls=":", lw=1)
        for step, event in run.events:
            kind = event.split(":")[0]
            if kind == "rescue":
                top.axvline(step, color="black", lw=1.2)
            elif kind == "checkpoint":
                top.plot(step, 0.02, marker="|", color="grey", transform=top.get_xaxis_transform())
            elif kind == "skip":
                top.plot(
                    step, 0.05, marker="x", color="orange", transform=top.get_xaxis_transform()
                )
    for name, p in thresholds.items():
        low.axhline(p, color="grey", lw=0.6, ls="--")
        low.text(0, p, f" {name}", va="bottom", fontsize=7, color="grey")
    title = "rescues (black), checkpoints (grey ticks), skips (x); dotted: the label's collapse"
    top.set(ylabel="training loss", title=f"collapse-guard demo: {title}")
    top.legend(loc="upper left")
    mid.set(ylabel="LR in force")
    low.set(xlabel="step", ylabel=f"P(collapse in {HORIZON} steps)", ylim=(0, 1))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def pinned_kernels(environ: Mapping[str, str], machine: str) -> dict[str, str]:
    """What of ``PINNED_KERNELS`` to set: on x86-64, the variables the user has not set."""
    if machine.lower() not in ("x86_64", "amd64"):
        return {}
    return {name: value for name, value in PINNED_KERNELS.items() if name not in environ}


def demo(
    steps: Annotated[int, typer.Option(min=1, help="Optimizer steps of each run.")] = DEFAULT[
        "steps"
    ],
    optimizer: Annotated[
        Optimizer, typer.Option(help="The runs' optimizer (datasets/real/optim.py).")
    ] = Optimizer[DEFAULT["optimizer"]],
    lr: Annotated[float, typer.Option(help="Peak LR before the re-warm.")] = DEFAULT["lr"],
    rewarm_at: Annotated[int, typer.Option(min=0, help="Step where the re-warm starts.")] = DEFAULT[
        "rewarm_at"
    ],
    rewarm_steps: Annotated[int, typer.Option(min=1, help="Steps of the slow re-warm.")] = DEFAULT[
        "rewarm_steps"
    ],
    rewarm_lr: Annotated[float, typer.Option(help="LR the re-warm ramps to.")] = DEFAULT[
        "rewarm_lr"
    ],
    batch_size: Annotated[int, typer.Option(min=1, help="Sequences per batch.")] = DEFAULT[
        "batch_size"
    ],
    seed: Annotated[int, typer.Option(help="Seeds the model and the batches.")] = DEFAULT["seed"],
    out: Annotated[
        Path, typer.Option(help="Folder of the plot, the guarded run file and checkpoints.")
    ] = Path("guard-demo"),
) -> None:
    """Train a small transformer twice, unguarded and guarded, into a slow LR re-warm."""
    import shutil

    if "torch" not in sys.modules:  # torch and MKL read them when torch is first imported
        os.environ.update(pinned_kernels(os.environ, platform.machine()))
    import torch
    from rich.console import Console

    from collapse_guard.predictor import RiskModel

    torch.set_num_threads(1)  # this model is too small to gain from more
    console = Console() if Console().is_terminal else Console(width=150)
    config = scenario(
        steps,
        lr,
        rewarm_at,
        rewarm_steps,
        rewarm_lr,
        optimizer=optimizer.value,
        batch_size=batch_size,
        seed=seed,
    )
    model = RiskModel.load()
    shutil.rmtree(out / "guarded", ignore_errors=True)  # a fresh ring: no old checkpoints
    runs = []
    for guarded in (False, True):
        with console.status(f"training the {'guarded' if guarded else 'unguarded'} run ..."):
            runs.append(run_scenario(config, model, guarded, out / "guarded"))
    title = (
        f"GPT 2x64, {optimizer.value}, LR {lr:g}, re-warmed from step "
        f"{config.rewarm_step or '-'} over {rewarm_steps} steps to {rewarm_lr:g}; "
        f"risk: model {model.meta['version']}"
    )
    console.print(_table(runs, title))
    path = plot(runs, model.thresholds, out / "demo.png")
    console.print(
        f"Plot: {path}. Guarded run file: {next((out / 'guarded').glob('run-*.parquet'))}. "
        "Lead = collapse step - first warning (positive: the warning came first)."
    )
