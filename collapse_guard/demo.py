"""``collapse-guard demo``: a small transformer trained with the probe, scored live by the
bundled default model.

Trains ``collapse_guard.datasets.real.model.GPT`` (2 layers, d_model 64, no qk-layernorm)
with the real-run generator's own loop (``datasets.real.runner.train``, on the Python
standard library's sources: no download). By default the LR is re-warmed mid-run to a
height that collapses the attention (Wortsman et al. 2023), so the table shows a collapse
happen: every ``--every`` steps a row of key signals, the default model's probability of
collapse within 200 steps for the window ending there, and its level. At the end the
run is labelled by the project's label and the first step of each level is printed.
It lives at the top level because it uses the probe, ``datasets`` and ``predictor``;
torch is imported when the command runs, so that ``collapse-guard --help`` stays fast.
"""

from __future__ import annotations

import math
import time
from typing import Annotated

import typer

__all__ = ["demo"]

_COLUMNS = (
    ("loss", "loss"),
    ("grad_norm", "grad norm"),
    ("update_ratio", "upd ratio"),
    ("attn_entropy_min", "attn H min"),
    ("attn_logit_max", "attn logit"),
    ("output_logit_max", "logit max"),
    ("lr", "lr"),
)
_REWARM_RAMP = 50  # steps from the scheduled LR to the re-warm LR


def _cell(value: float) -> str:
    if math.isnan(value):
        return "-"
    value += 0.0  # -0.0 (an entropy rounded to nothing) prints as 0
    return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.2e}"


class _ScoredProbe:
    """The probe, plus a table row with the model's risk every ``every`` steps.

    ``runner.train`` calls it where it calls a probe; the probe measures, this only
    keeps the records and reads them to the model (the probe observes, the model
    scores).
    """

    def __init__(self, probe, model, table, every: int, steps: int):
        self.probe, self.model, self.table = probe, model, table
        self.every, self.steps = every, steps
        self.records: list[dict[str, float]] = []
        self.risk: dict[int, float] = {}
        from collapse_guard.features import RunContext  # the run so far, for the windows

        self.context = RunContext.from_schema(model.schema)

    def after_backward(self, loss) -> None:
        self.probe.after_backward(loss)

    def after_step(self) -> dict[str, float]:
        record = self.probe.after_step()
        self.records.append(record)
        step = len(self.records) - 1
        self.context.update(step, record)
        if step % self.every == 0 or step == self.steps - 1:
            first = max(0, step + 1 - self.model.schema.window)
            window = _frame(self.records, first)
            p = self.risk[step] = self.model.predict_window(window, context=self.context.get())
            row = [_cell(record[key]) for key, _ in _COLUMNS]
            self.table.add_row(str(step), *row, f"{p:.2f}", self.model.level(p))
        return record


def demo(
    steps: Annotated[int, typer.Option(min=1, help="Optimizer steps to train.")] = 500,
    every: Annotated[
        int, typer.Option(min=1, help="Print a row (and probe attention) every N steps.")
    ] = 25,
    lr: Annotated[float, typer.Option(help="Peak AdamW learning rate.")] = 6e-3,
    rewarm_at: Annotated[
        int, typer.Option(min=0, help="Step where the LR is re-warmed; 0 = never.")
    ] = 250,
    rewarm_lr: Annotated[float, typer.Option(help="LR the re-warm ramps to.")] = 0.2,
    batch_size: Annotated[int, typer.Option(min=1, help="Sequences per batch.")] = 8,
    seed: Annotated[int, typer.Option(help="Seeds the model and the batches.")] = 0,
) -> None:
    """Train a small transformer with the probe; the bundled model scores it as it goes."""
    import torch
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    from collapse_guard.datasets.label import label_run
    from collapse_guard.datasets.real.config import RealRunConfig
    from collapse_guard.datasets.real.runner import build, train
    from collapse_guard.predictor import RiskModel
    from collapse_guard.probe import Probe, ProbeConfig

    torch.set_num_threads(1)  # this model is too small to gain from more
    config = RealRunConfig(
        recipe="demo",
        seed=seed,
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        warmup_steps=max(1, min(40, steps // 10)),
        min_lr_ratio=1.0,
        rewarm_step=rewarm_at if rewarm_at < steps else 0,
        rewarm_steps=_REWARM_RAMP,
        rewarm_lr=rewarm_lr,
    )
    model = RiskModel.load()
    net, optimizer = build(config)
    table = Table(
        title=f"collapse-guard: GPT 2x64, LR {lr:g}"
        + (f", re-warmed to {rewarm_lr:g} at step {rewarm_at}" if config.rewarm_step else "")
        + f"; risk from model {model.meta['version']}"
    )
    table.add_column("step", justify="right")
    for _, header in (*_COLUMNS, ("", "risk"), ("", "level")):
        table.add_column(header, justify="right")
    probe = Probe(net, optimizer, ProbeConfig(attention_every=every, system_every=every))
    scored = _ScoredProbe(probe, model, table, every, steps)
    console = Console()
    if not console.is_terminal:  # a pipe or a log file: rich would assume 80 columns
        console = Console(width=150)
    start = time.perf_counter()
    with Live(table, console=console, refresh_per_second=4):
        steps_run = train(config, net, optimizer, scored)
    probe.close()
    if not console.is_terminal:  # Live's last frame ends without a newline off a terminal
        console.line()
    console.print(_summary(scored, label_run(_frame(scored.records)), model, steps_run, start))


def _frame(records: list[dict[str, float]], first: int = 0):
    """The probe's records from step ``first`` on, as a run frame (``step`` + signals)."""
    import pandas as pd

    return pd.DataFrame(records[first:]).assign(step=range(first, len(records)))


def _summary(scored: _ScoredProbe, label, model, steps_run: int, start: float) -> str:
    firsts = []
    for level in ("watch", "warn", "critical"):
        over = [s for s, p in scored.risk.items() if p >= model.thresholds[level]]
        firsts.append(f"{level} {min(over) if over else '-'}")
    outcome = (
        f"collapse at step {label.onset_step} ({label.kind})" if label.collapsed else "no collapse"
    )
    return (
        f"{steps_run} steps in {time.perf_counter() - start:.1f} s. Label: {outcome}. "
        f"First printed step at each level: {', '.join(firsts)}. Risk = P(collapse within "
        f"{model.horizon} steps); levels are set as false-alarm budgets (README)."
    )
