"""``collapse-guard data real``: train small transformers here and record labelled runs."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from collapse_guard.datasets.real.config import RealRunConfig

__all__ = ["real_command"]


def real_command(
    n: Annotated[int, typer.Option("--n", help="Number of runs in the sweep.")],
    workers: Annotated[int, typer.Option("--workers", help="Local worker processes.")] = 2,
    out: Annotated[Path, typer.Option("--out", help="Folder for the run files.")] = Path(
        "runs/real"
    ),
    seed: Annotated[int, typer.Option("--seed", help="Seed of the config sweep.")] = 0,
    scheduler: Annotated[
        str | None,
        typer.Option("--scheduler", help="Dask scheduler address; runs go to its workers."),
    ] = None,
    steps: Annotated[
        int, typer.Option("--steps", help="Optimizer steps per run.")
    ] = RealRunConfig.steps,
) -> None:
    """Train N small GPTs with sampled knobs and faults; write labelled run files to OUT.

    Resumable: run files already in OUT are kept, unfinished ones are redone.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # before anything imports torch
    from collapse_guard.datasets.real.pool import generate_real_runs, run_id_for
    from collapse_guard.datasets.runfile import read_meta

    existing = sum((out / f"{run_id_for(seed, i)}.parquet").exists() for i in range(n))
    began = time.perf_counter()
    paths = generate_real_runs(n, out, workers=workers, seed=seed, scheduler=scheduler, steps=steps)
    minutes = (time.perf_counter() - began) / 60
    metas = [read_meta(path) for path in paths]
    causes = Counter(m.extra.get("collapse_cause") for m in metas if m.onset_step is not None)
    made = len(paths) - existing
    rate = f", {made / minutes:.2f} runs/min" if made else ""
    typer.echo(
        f"{len(paths)} runs in {out}: {sum(causes.values())} collapsed ("
        + ", ".join(f"{cause} {count}" for cause, count in causes.most_common())
        + f"); made {made} in {minutes:.1f} min{rate}, {existing} already there"
    )
