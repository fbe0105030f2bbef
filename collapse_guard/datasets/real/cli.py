"""``collapse-guard data real``: train small transformers here and record labelled runs."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from collapse_guard.datasets.real.config import RealRunConfig

__all__ = ["SWEEPS", "real_command"]

SWEEPS = ("main", "breadth")  # the sampler's sweeps; breadth: ``breadth.py``


def real_command(
    n: Annotated[int, typer.Option("--n", min=1, help="Number of runs in the sweep.")],
    workers: Annotated[int, typer.Option("--workers", min=1, help="Local worker processes.")] = 2,
    out: Annotated[Path, typer.Option("--out", help="Folder for the run files.")] = Path(
        "runs/real"
    ),
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seed of the config sweep.")] = 0,
    scheduler: Annotated[
        str | None,
        typer.Option("--scheduler", help="Dask scheduler address; runs go to its workers."),
    ] = None,
    steps: Annotated[
        int, typer.Option("--steps", min=1, help="Optimizer steps per run.")
    ] = RealRunConfig.steps,
    recipes: Annotated[
        str,
        typer.Option(
            "--recipes", help="Only these recipes, comma-separated (e.g. slow_ramp,constant_high)."
        ),
    ] = "",
    optimizers: Annotated[
        str, typer.Option("--optimizers", help="Only these optimizers, comma-separated.")
    ] = "",
    families: Annotated[
        str,
        typer.Option("--families", help="Only these model families, comma-separated (e.g. drawn)."),
    ] = "",
    sweep: Annotated[
        str,
        typer.Option(
            "--sweep",
            help="main, or breadth: Muon, every part of the drawn family, nanogpt on larger "
            "models (its own run ids).",
        ),
    ] = "main",
) -> None:
    """Train N small transformers (3 families, 3 optimizers, 2 kinds of data) with sampled
    recipes, knobs and faults; write labelled run files to OUT.

    Resumable: run files already in OUT are kept, unfinished ones are redone. A sweep
    narrowed by --recipes / --optimizers / --families has run ids of its own, so it can top up a
    folder that holds the full sweep; so has the breadth sweep (--sweep breadth), which they
    narrow too.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # before anything imports torch
    from collapse_guard.datasets.real.pool import generate_real_runs, run_id_for
    from collapse_guard.datasets.real.sampler import Focus
    from collapse_guard.runfiles.reader import read_meta

    try:
        if sweep not in SWEEPS:
            raise ValueError(f"unknown sweep {sweep!r}; expected one of {', '.join(SWEEPS)}")
        focus = Focus(
            _names(recipes), _names(optimizers), _names(families), breadth=sweep == "breadth"
        )
    except ValueError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a file in the way, no permission: one line, not a traceback
        typer.echo(
            f"error: {out}: cannot make the folder for the run files ({err.strerror}); "
            "pass --out a folder you can write to",
            err=True,
        )
        raise typer.Exit(2) from None
    planned = [out / f"{run_id_for(seed, i, focus)}.parquet" for i in range(n)]
    existing = sum(path.exists() for path in planned)
    began = time.perf_counter()
    try:
        paths = generate_real_runs(
            n, out, workers=workers, seed=seed, scheduler=scheduler, steps=steps, focus=focus
        )
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (parallel.Stopped)
        name = getattr(stop, "signal_name", "Ctrl-C")
        finished = sum(path.exists() for path in planned)
        typer.echo(
            f"stopped by {name}: {finished} of {n} runs finished in {out} "
            f"({finished - existing} of them now); run the same command again to resume "
            "(finished runs are kept, unfinished ones redone)",
            err=True,
        )
        raise typer.Exit(143 if name == "SIGTERM" else 130) from None
    minutes = (time.perf_counter() - began) / 60
    metas = [read_meta(path) for path in paths]
    collapsed = [m for m in metas if m.onset_step is not None]
    kinds = Counter(m.extra.get("onset_kind") for m in collapsed)
    causes = Counter(m.extra.get("collapse_cause") for m in collapsed)
    made = len(paths) - existing
    rate = f", {made / minutes:.2f} runs/min" if made else ""
    typer.echo(
        f"{len(paths)} runs in {out}: {len(collapsed)} collapsed "
        f"({kinds['develops']} develop, {kinds['sudden']} sudden; "
        + ", ".join(f"{cause} {count}" for cause, count in causes.most_common())
        + f"); made {made} in {minutes:.1f} min{rate}, {existing} already there"
    )


def _names(option: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in option.split(",") if name.strip())
