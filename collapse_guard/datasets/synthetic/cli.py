"""``collapse-guard data synth``: generate labelled synthetic runs.

A plain function with Typer annotations, mounted by ``collapse_guard/datasets/cli.py``;
numpy, pandas and the generator are imported inside it so ``collapse-guard --help``
stays fast.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["synth_command"]


def synth_command(
    n: Annotated[int, typer.Option("--n", min=1, help="Number of runs to generate.")] = 1000,
    out: Annotated[Path, typer.Option("--out", help="Folder for the run files.")] = Path(
        "runs/synthetic"
    ),
    seed: Annotated[
        int, typer.Option("--seed", min=0, help="Master seed; run i is the same for any n.")
    ] = 0,
    workers: Annotated[
        int,
        typer.Option("--workers", min=1, help="Processes (spawn pool); files do not depend on it."),
    ] = max(1, min(os.cpu_count() or 1, 8)),
    collapse_share: Annotated[
        float,
        typer.Option("--collapse-share", min=0.0, max=1.0, help="Share of runs that collapse."),
    ] = 0.4,
) -> None:
    """Generate N labelled synthetic runs into OUT (existing files are kept: resumable)."""
    from rich.console import Console

    from collapse_guard.datasets.synthetic.agreement import label_agreement
    from collapse_guard.datasets.synthetic.generate import generate_synthetic_runs
    from collapse_guard.datasets.synthetic.sampler import SamplerConfig
    from collapse_guard.runfiles import read_meta

    console = Console()
    paths = generate_synthetic_runs(
        n,
        out,
        seed,
        workers=workers,
        config=SamplerConfig(collapse_share=collapse_share),
        progress=True,
    )
    report = label_agreement(read_meta(p) for p in paths)
    console.print(f"{len(paths)} runs in {out}")
    console.print(report.summary())
