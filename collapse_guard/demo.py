"""``collapse-guard demo``: a small transformer trained with the probe, signals printed live.

Trains ``collapse_guard.datasets.real.model.GPT`` (2 layers, d_model 64) on the first
megabyte of the real-run generator's corpus (the Python standard library's own sources,
``datasets.real.corpus``: no download) and prints a table of key signals every
``--every`` steps. It lives at the top level, not in ``probe``, because it uses both the
probe and ``datasets``; torch is imported when the command runs, so that
``collapse-guard --help`` stays fast.
"""

from __future__ import annotations

import math
import time
from typing import Annotated

import typer

__all__ = ["demo"]

_CORPUS_BYTES = 1_000_000  # ~1 MB: 200 steps of 8x64 tokens see a tenth of it
_COLUMNS = (
    ("loss", "loss"),
    ("grad_norm", "grad norm"),
    ("grad_cv", "grad CV"),
    ("update_cos", "upd cos"),
    ("update_flips", "flips"),
    ("update_ratio", "upd ratio"),
    ("attn_entropy_mean", "attn H"),
    ("attn_kl", "attn KL"),
    ("attn_saturation", "attn sat"),
    ("output_logit_max", "logit max"),
    ("lr", "lr"),
)


def _cell(value: float) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.2e}"


def demo(
    steps: Annotated[int, typer.Option(min=1, help="Optimizer steps to train.")] = 200,
    every: Annotated[
        int, typer.Option(min=1, help="Print a row (and probe attention) every N steps.")
    ] = 25,
    lr: Annotated[float, typer.Option(help="Peak AdamW learning rate.")] = 3e-3,
    batch_size: Annotated[int, typer.Option(min=1, help="Sequences per batch.")] = 8,
    seed: Annotated[int, typer.Option(help="Seeds the model and the batches.")] = 0,
) -> None:
    """Train a small transformer with the probe and print its signals."""
    import torch
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    from collapse_guard.datasets.real.corpus import load_corpus
    from collapse_guard.datasets.real.model import GPT, GPTConfig
    from collapse_guard.probe import Probe, ProbeConfig

    torch.manual_seed(seed)
    config = GPTConfig(n_layer=2, d_model=64, n_head=4, seq_len=64)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    probe = Probe(model, optimizer, ProbeConfig(attention_every=every, system_every=every))
    data = torch.from_numpy(load_corpus(_CORPUS_BYTES).astype("int64"))  # a writable copy
    generator = torch.Generator().manual_seed(seed)
    warmup = max(1, steps // 10)

    table = Table(title=f"collapse-guard probe: GPT 2x64 on {len(data):,} bytes of the stdlib")
    table.add_column("step", justify="right")
    for _, header in _COLUMNS:
        table.add_column(header, justify="right")
    start = time.perf_counter()
    console = Console()
    if not console.is_terminal:  # a pipe or a log file: rich would assume 80 columns
        console = Console(width=150)
    with Live(table, console=console, refresh_per_second=4):
        for step in range(steps):
            # linear warmup then cosine to zero, set by hand as nanoGPT does
            progress = (step - warmup) / max(1, steps - warmup)
            scale = (
                (step + 1) / warmup if step < warmup else 0.5 * (1 + math.cos(math.pi * progress))
            )
            for group in optimizer.param_groups:
                group["lr"] = lr * scale
            starts = torch.randint(
                len(data) - config.seq_len - 1, (batch_size,), generator=generator
            )
            window = torch.stack([data[s : s + config.seq_len + 1] for s in starts.tolist()])
            _, loss = model(window[:, :-1], window[:, 1:])
            loss.backward()
            probe.after_backward(loss)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            record = probe.after_step()
            optimizer.zero_grad(set_to_none=True)
            if step % every == 0 or step == steps - 1:
                table.add_row(str(step), *(_cell(record[key]) for key, _ in _COLUMNS))
    probe.close()
    if not console.is_terminal:  # Live's last frame ends without a newline off a terminal
        console.line()
    console.print(
        f"{steps} steps in {time.perf_counter() - start:.1f} s; every column is a signal of "
        "collapse_guard.signals ('-' = not measured at that step)."
    )
