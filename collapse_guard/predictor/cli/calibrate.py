"""``collapse-guard calibrate``: a model's levels set on your own healthy runs.

>>> collapse-guard calibrate --runs runs/healthy --out models/my-setup
>>> collapse-guard serve --model models/my-setup      # or Guard(..., risk="models/my-setup")

The library is :func:`collapse_guard.predictor.core.recalibrate.calibrate`; this prints what
backs each level and where the model went. Heavy imports happen inside the body.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from collapse_guard.errors import UserInputError
from collapse_guard.predictor.core.model_source import MODEL_HELP, load_risk_model

__all__ = ["calibrate_command"]


def _check_out(out: Path) -> None:
    if out.exists() and any(out.iterdir()):
        raise UserInputError(
            f"--out {out} exists and is not empty",
            "name a new folder (a calibrated model is a new version: it never overwrites one)",
        )


def _evidence_table(before, after):
    from rich.table import Table

    table = Table(title=f"levels of {after.meta['version']} (from {after.meta['base_version']})")
    for column in ("level", "budget", "before", "after", "episodes", "healthy steps", "backed"):
        table.add_column(column, justify="left" if column in ("level", "backed") else "right")
    for level, evidence in after.meta["levels_evidence"].items():
        backed = (
            "certified"
            if evidence["certified"]
            else f"extrapolated: {evidence['steps_needed']:,} steps certify it"
        )
        table.add_row(
            level,
            f"1/{evidence['budget']:,.0f}",
            f"{before.thresholds[level]:.3g}",
            f"{evidence['threshold']:.3g}",
            str(evidence["episodes"]),
            f"{evidence['healthy_steps']:,}",
            backed,
        )
    return table


def calibrate_command(
    runs: Annotated[
        list[Path],
        typer.Option(
            "--runs",
            help="Healthy runs of your set-up: folders of run files (*.parquet, searched "
            "recursively) or run files. Runs that collapsed or that the model saw are refused.",
        ),
    ],
    out: Annotated[Path, typer.Option(help="Folder to write the calibrated model to (new).")],
    model: Annotated[str | None, typer.Option("--model", help=MODEL_HELP)] = None,
    confidence: Annotated[
        float,
        typer.Option(help="One-sided confidence that each level holds its false-alarm budget."),
    ] = 0.9,
    register: Annotated[
        bool,
        typer.Option(help="Also register it in MLflow as a version of collapse-predictor."),
    ] = False,
    alias: Annotated[
        str | None, typer.Option(help="With --register: point this registry alias at it.")
    ] = None,
) -> None:
    """Set the levels of a model on your healthy runs; booster and calibration kept."""
    from rich.console import Console

    if alias and not register:
        raise UserInputError("--alias needs --register", "add --register")
    _check_out(out)
    base = load_risk_model(model)
    tuned = base.calibrate(runs, confidence=confidence)
    tuned.save(out)
    console = Console()
    console.print(_evidence_table(base, tuned))
    console.print(f"calibrated model written to {out}")
    if register:
        from collapse_guard.predictor.lifecycle.registry import log_calibration

        record = log_calibration(tuned, alias=alias)
        console.print(f"registered as collapse-predictor version {record.version}")
