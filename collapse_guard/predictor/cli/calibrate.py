"""``collapse-guard calibrate``: a model's levels set on your own healthy runs.

>>> collapse-guard calibrate --runs runs/healthy --out models/my-setup
>>> collapse-guard serve --model models/my-setup      # or Guard(..., risk="models/my-setup")

The library is :func:`collapse_guard.predictor.core.recalibrate.calibrate`; this prints what
backs each level (a new run's chance to alarm at it, bounded by the runs given), one
line per level those runs cannot certify (with the runs that would), where the
model went, and, registered, its version and alias. Heavy imports happen inside the body.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from collapse_guard.errors import UserInputError
from collapse_guard.predictor.core.model_source import MODEL_HELP, load_risk_model

__all__ = ["calibrate_command"]

# an empty --runs folder: calibration needs the user's own healthy runs, not made-up ones
_HEALTHY_RUNS = (
    "calibration needs healthy runs of your own set-up: record them in your training loop "
    "with Probe(model, optimizer).record_to('runs/healthy/run-1.parquet')"
)


def _check_out(out: Path) -> None:
    if out.exists() and any(out.iterdir()):
        raise UserInputError(
            f"--out {out} exists and is not empty",
            "name a new folder (a calibrated model is a new version: it never overwrites one)",
        )


def _evidence_table(before, after):
    from rich.table import Table

    table = Table(title=f"levels of {after.meta['version']} (from {after.meta['base_version']})")
    columns = ("level", "budget", "before", "after", "episodes", "P(new run alarms)", "backed")
    for column in columns:
        table.add_column(column, justify="left" if column in ("level", "backed") else "right")
    for level, evidence in after.meta["levels_evidence"].items():
        table.add_row(
            level,
            f"1/{evidence['budget']:,.0f}",
            f"{before.thresholds[level]:.3g}",
            f"{evidence['threshold']:.3g}",
            str(evidence["episodes"]),
            # a new run's chance to alarm, bounded at the confidence asked (the run as unit)
            f"<= {evidence['exceedance_bound']:.2g} (want {min(evidence['run_target'], 1):.2g})",
            "certified" if evidence["certified"] else _uncertified(evidence),
        )
    return table


def _uncertified(evidence) -> str:
    if evidence["basis"] == "steps":
        return f"extrapolated: {evidence['steps_needed']:,} steps certify it"
    return f"extrapolated: {evidence['runs_needed']:,} runs certify it"


def _warnings(tuned) -> list[str]:
    """One line per level the runs given cannot certify: its stored note, which starts
    with the level's name (``warn: 3 healthy runs certify at most ...``)."""
    return [
        evidence["note"]
        for evidence in tuned.meta["levels_evidence"].values()
        if not evidence["certified"]
    ]


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
    from collapse_guard.predictor.core.recalibrate import check_confidence
    from collapse_guard.runfiles.records import find_run_files

    if confidence is not None:  # before any run is read
        check_confidence(confidence)
    paths = find_run_files(runs, empty_hint=_HEALTHY_RUNS)
    base = load_risk_model(model)
    tuned = base.calibrate(paths, confidence=confidence)
    tuned.save(out)
    console = Console(soft_wrap=True)  # a warning is one line, however wide the terminal
    console.print(_evidence_table(base, tuned))
    for line in _warnings(tuned):
        console.print(line, markup=False, highlight=False)
    console.print(f"calibrated model written to {out}")
    if register:
        from collapse_guard.predictor.lifecycle.registry import MODEL_NAME, log_calibration

        record = log_calibration(tuned, alias=alias)
        named = f"; alias {alias!r} points at it ({MODEL_NAME}@{alias})" if alias else ""
        console.print(f"registered as {MODEL_NAME} version {record.version}{named}")
