"""``collapse-guard retrain``: the command face of ``predictor.lifecycle.retrain.retrain``.

Heavy imports (mlflow, lightgbm, dask) happen inside the command, so that
``collapse-guard --help`` stays fast. Bad input (no run file among ``--runs``, a tracking
store in a folder that does not exist, too few runs) is a ``UserInputError``: the
``collapse-guard`` app prints it as one line and exits with code 2; a retrain that fails so
leaves no copy in ``<base>/ingested/``. Every line names the challenger and the champion by
their registered version (``v2``), as MLflow does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from collapse_guard.errors import UserInputError
from collapse_guard.predictor.cli.options import (
    HOLD,
    POSITIVES,
    RISE_WEIGHT,
    STRIDE,
    training_settings,
)

__all__ = ["retrain"]


def _use_tracking_uri(uri: str | None) -> None:
    # The store is process-wide (MLFLOW_TRACKING_URI, read by predictor.core.store); a SQLite
    # store is created on first use, but its folder must exist.
    if uri is None:
        return
    if uri.startswith("sqlite:///"):
        folder = Path(uri.removeprefix("sqlite:///")).parent
        if not folder.is_dir():
            raise UserInputError(
                f"--tracking-uri {uri}: the folder {folder} does not exist",
                "create it, or pass the URI of an existing store",
            )
    os.environ["MLFLOW_TRACKING_URI"] = uri


def _print_skipped(console, report) -> None:
    # at once, before training: a retrain that fails later (too few runs) still names them
    for item in report.rejected:
        console.print(f"[yellow]skipped[/] {item.name}: {item.reason}", soft_wrap=True)
    if report.ignored:
        console.print(f"ignored {len(report.ignored)} file(s) that are not *.parquet run files")


def _print_guarded(console, report) -> None:
    for item in report.ingested:
        censoring = item.censoring
        if censoring is None:
            continue
        if censoring.rescue is not None:
            console.print(
                f"{item.run_id}: guarded, rescued at step {censoring.rescue}: a caught "
                f"collapse, {censoring.rows_kept} rows up to it kept"
            )
        elif censoring.censored:
            console.print(
                f"{item.run_id}: guarded; {censoring.rows_kept} of {censoring.rows_before} rows "
                f"kept, those after step {censoring.kept_until} censored (the guard first "
                f"changed its course at step {censoring.first_intervention})"
            )


def retrain(
    runs: Annotated[
        list[str],
        typer.Option(
            "--runs",
            metavar="PATH_OR_URL",
            help="New run files: a folder (searched recursively), a run file, or an fsspec "
            "URL (file://, s3://, gs://, ...): --runs A B or --runs A --runs B.",
        ),
    ],
    base: Annotated[
        Path,
        typer.Option(
            "--base",
            help="The dataset folder: every run the models train on; new runs are copied "
            "into <base>/ingested/.",
        ),
    ] = Path("runs"),
    tracking_uri: Annotated[
        str | None,
        typer.Option(
            "--tracking-uri",
            metavar="URI",
            help="MLflow store; default MLFLOW_TRACKING_URI, else sqlite ./mlruns/mlflow.db.",
        ),
    ] = None,
    dask: Annotated[
        str | None,
        typer.Option(
            "--dask",
            metavar="SCHEDULER",
            help="Compute the training rows on Dask: 'local' (2-worker cluster here) or a "
            "scheduler address tcp://host:8786.",
        ),
    ] = None,
    experiment: Annotated[str, typer.Option(help="MLflow experiment.")] = "collapse-guard",
    seed: Annotated[int, typer.Option(help="Seeds the split, LightGBM and the benchmark.")] = 0,
    stride: Annotated[int | None, STRIDE] = None,
    hold_steps: Annotated[int | None, HOLD] = None,
    positives_within: Annotated[int | None, POSITIVES] = None,
    healthy_rise_weight: Annotated[float | None, RISE_WEIGHT] = None,
    recalibrate: Annotated[
        bool,
        typer.Option(
            help="Set the challenger's levels on the new healthy runs it did not train on "
            "(collapse-guard calibrate); --no-recalibrate keeps its validation runs' levels."
        ),
    ] = True,
) -> None:
    """Retrain on new runs: ingest them, train a challenger (as the champion was trained, the
    training flags given over it), compare it with the champion on
    runs neither has seen (the new set-up's held-out runs, the frozen benchmark judging
    ranking only; or the benchmark and the new runs), promote it only by the rule.

    Running it again after a crash finishes the job; running it again after it finished
    changes nothing.
    """
    settings = training_settings(  # over the champion's own training (lifecycle.retrain)
        seed=seed,
        stride=stride,
        hold_steps=hold_steps,
        positives_within=positives_within,
        healthy_rise_weight=healthy_rise_weight,
    )
    _use_tracking_uri(tracking_uri)
    from rich.console import Console

    from collapse_guard.predictor.lifecycle.retrain import retrain as run_retrain

    console = Console()
    result = run_retrain(
        runs,
        base=base,
        experiment=experiment,
        dask=dask,
        require_new=True,
        recalibrate=recalibrate,
        progress=console.log,
        on_ingest=lambda report: _print_skipped(console, report),
        **settings,
    )
    _print_guarded(console, result.ingest)
    compared = f"on {len(result.comparison_run_ids)} runs neither model saw"
    if "compare.ranking_n_runs" in result.metrics:
        ranked = int(result.metrics["compare.ranking_n_runs"])
        compared = (
            f"on {len(result.comparison_run_ids)} held-out runs of the new set-up, "
            f"ranking on {ranked} benchmark runs"
        )
    if result.promoted:
        console.print(f"[green]v{result.version} is now champion[/] ({compared}): {result.reason}")
    else:
        console.print(
            f"[yellow]v{result.version} kept out; champion stays v{result.champion}[/] "
            f"({compared}): {result.reason}",
            soft_wrap=True,
        )
    console.print(f"MLflow run {result.mlflow_run_id} in experiment {experiment!r}")
