"""``collapse-guard train | evaluate | predict``, as functions that ``collapse_guard.cli`` mounts.

Heavy imports (mlflow, lightgbm, pandas, dask) happen inside the bodies, so that
``collapse-guard --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = [
    "comparison_scores",
    "evaluate_command",
    "predict_command",
    "print_report",
    "run_paths",
    "train_command",
]

_RUNS = typer.Option(
    "--runs", help="Folder of run files (*.parquet, searched recursively) or a run file; repeat."
)
_MODEL = typer.Option(
    "--model",
    help="Model: omitted = the bundled default; 'models:/collapse-predictor@champion'; a folder.",
)


def run_paths(sources: list[Path]) -> list[Path]:
    """Run files under the given folders (recursively) and files, in a stable order."""
    from collapse_guard.datasets.runfile import list_runs

    paths: list[Path] = []
    for source in sources:
        if source.is_dir():
            found = list_runs(source)
            if not found:
                raise typer.BadParameter(
                    f"no runs found under {source}: expected *.parquet run files; make some "
                    "with `collapse-guard data synth` or `collapse-guard data real`",
                    param_hint="--runs",
                )
            paths.extend(found)
        elif source.is_file():
            paths.append(source)
        else:
            raise typer.BadParameter(
                f"{source} does not exist: expected a folder of run files or a run file",
                param_hint="--runs",
            )
    return sorted(set(paths))


def _scorer_table(report, title: str, source: str = "all"):
    """Rich table: every scorer at the false-alarm budget, and the model at its stored levels.

    ``lead`` is the median lead time of caught collapses, in steps.
    """
    from rich import box
    from rich.table import Table

    # SIMPLE_HEAD and short headers: the table must fit 80 columns (rich's width off a tty)
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("scorer", "alarm at", "recall", "caught", "lead", "FA/10k", "PR-AUC", "Brier"):
        text = column in ("scorer", "alarm at")
        table.add_column(column, justify="left" if text else "right", no_wrap=text)

    def fmt(value, digits: int = 3) -> str:
        return "—" if value is None or value != value else f"{value:.{digits}g}"

    frame = report.to_frame()
    rows = frame[(frame["source"] == source) & (frame["operating_point"] != "native")]
    rows = rows[(rows["scorer"] == "model") | (rows["operating_point"] == "budget")]
    for r in rows.itertuples():
        style = "bold" if r.scorer == "model" and r.operating_point == "budget" else None
        table.add_row(
            r.scorer,
            r.operating_point.removeprefix("level:"),
            fmt(r.recall),
            f"{r.caught}/{r.n_collapsed}",
            fmt(r.median_lead),
            fmt(r.fa_per_10k),
            fmt(r.pr_auc),
            fmt(r.brier, 2),
            style=style,
        )
    return table


def print_report(console, report, heading: str) -> None:
    """Print the scorer table for all sources pooled, then per source when there are several."""
    sources = sorted(set(report.to_frame()["source"]) - {"all"})
    budget = f"{report.budget_per_10k:g} false alarm per 10k healthy steps"
    console.print(_scorer_table(report, f"{heading}: all sources, at {budget}"))
    if len(sources) > 1:
        for source in sources:
            console.print(_scorer_table(report, f"{heading}: {source}", source=source))


def _kind_table(report, grouping: str, title: str):
    """Rich table: per collapse kind, the model's recall and lead at the budget beside the
    best baseline's recall there (``grouping``: the label's ``kind`` or the ``cause``)."""
    from rich import box
    from rich.table import Table

    wide = report.kind_table(grouping)
    baselines = [
        c.removesuffix(" recall")
        for c in wide.columns
        if c.endswith(" recall") and c != "model recall"
    ]
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for column in (grouping, "n", "recall", "lead", "best baseline"):
        table.add_column(
            column, justify="left" if column in (grouping, "best baseline") else "right"
        )

    def fmt(value, digits: int = 3) -> str:
        return "—" if value is None or value != value else f"{value:.{digits}g}"

    for kind, row in wide.iterrows():
        recalls = {
            b: row[f"{b} recall"] for b in baselines if row[f"{b} recall"] == row[f"{b} recall"]
        }
        best = max(recalls, key=recalls.get, default=None)
        table.add_row(
            str(kind),
            str(row["n"]),
            fmt(row.get("model recall")),
            fmt(row.get("model lead")),
            "—" if best is None or not recalls[best] else f"{best} {fmt(recalls[best])}",
        )
    return table


def comparison_scores(runs, budgets: dict):
    """The promotion score: one evaluation, applied to the new model and to the champion."""
    from collapse_guard.predictor.evaluation import evaluate_runs

    # "recall at the warn budget": the warn level's false-alarm rate, per 10k healthy steps
    per_10k = 10_000 / budgets["warn"]

    def score(model) -> dict[str, float]:
        row = evaluate_runs(runs, model, budget_per_10k=per_10k).get("model")
        return {
            "recall_at_warn": row["recall"],
            "pr_auc": row["pr_auc"],
            "brier": row["brier"],
            "median_lead": row["median_lead"],
        }

    return score


def train_command(
    runs: Annotated[list[Path], _RUNS],
    experiment: Annotated[str, typer.Option(help="MLflow experiment name.")] = "collapse-guard",
    seed: Annotated[int, typer.Option(help="Seeds the run split and LightGBM.")] = 0,
    dask: Annotated[
        str | None,
        typer.Option(help="Train on Dask: 'local' (2-worker cluster) or a scheduler address."),
    ] = None,
    register: Annotated[
        bool, typer.Option(help="Register in MLflow as collapse-predictor; promote if better.")
    ] = True,
) -> None:
    """Train a risk model, log it to MLflow, register it and promote it if it beats the champion.

    Tracking store: MLFLOW_TRACKING_URI, else SQLite at ./mlruns/mlflow.db.
    """
    import tempfile
    from contextlib import nullcontext
    from functools import partial

    from rich.console import Console

    from collapse_guard.datasets.runfile import read_meta
    from collapse_guard.predictor import registry
    from collapse_guard.predictor.plots import report_artifacts
    from collapse_guard.predictor.train import train_risk_model
    from collapse_guard.predictor.training_data import load_runs

    console = Console()
    paths = run_paths(runs)
    console.log(f"{len(paths)} run files; tracking store {registry.tracking_uri()}")
    fingerprint = registry.dataset_fingerprint(paths)
    if dask:
        from collapse_guard.predictor.fleet import fit_on_cluster, fleet_client

        cluster = fleet_client(dask)
    else:
        cluster = nullcontext()
    with cluster as client:
        fit = {"fit": partial(fit_on_cluster, client=client)} if dask else {}
        model, report = train_risk_model(paths, seed=seed, progress=console.log, **fit)
    print_report(console, report, "test runs")
    test_ids = set(model.meta["split"]["test"])
    test_runs = load_runs([p for p in paths if read_meta(p).run_id in test_ids])
    params = {
        "seed": seed,
        "window": model.schema.window,
        "horizon": model.horizon,
        "stride": model.meta.get("stride"),
        "n_run_files": len(paths),
        "trainer": model.meta.get("trainer", "lightgbm"),
        **{f"split.{k}": v for k, v in model.meta["n_runs"].items()},
        **{f"budget.{k}": v for k, v in model.budgets.items()},
        **{f"threshold.{k}": v for k, v in model.thresholds.items()},
        **{f"lgbm.{k}": v for k, v in model.meta.get("params", {}).items()},
    }
    with tempfile.TemporaryDirectory(prefix="collapse-guard-plots-") as plots:
        report_artifacts(model, report, plots)
        record = registry.log_training(
            model,
            metrics=report.to_metrics(),
            score=comparison_scores(test_runs, model.budgets),
            params=params,
            fingerprint=fingerprint,
            artifacts=plots,
            experiment=experiment,
            register=register,
        )
    console.print(f"MLflow run {record.run_id} in experiment {experiment!r}")
    if record.version is None:
        console.print("not registered (--no-register)")
    elif record.promoted:
        console.print(f"[green]registered v{record.version}, now champion[/]: {record.reason}")
    else:
        console.print(
            f"[yellow]registered v{record.version}; champion stays v{record.previous_champion}"
            f"[/]: {record.reason} (new {record.new_scores}, champion {record.champion_scores})"
        )


def evaluate_command(
    runs: Annotated[list[Path], _RUNS],
    model: Annotated[str | None, _MODEL] = None,
) -> None:
    """Evaluate a model beside the baselines on run files, per source.

    Evaluate on runs the model was not trained on: the bundled model saw the runs that
    `python -m collapse_guard.predictor.bundle` made.
    """
    from rich.console import Console

    from collapse_guard.predictor.baselines import default_baselines
    from collapse_guard.predictor.evaluation import evaluate_runs
    from collapse_guard.predictor.risk import RiskModel
    from collapse_guard.predictor.training_data import load_runs

    console = Console()
    risk_model = RiskModel.load(model)
    records = load_runs(run_paths(runs))
    console.log(f"{risk_model!r} on {len(records)} runs")
    # no training runs here, so no config-only baseline: it must be fitted on other runs
    report = evaluate_runs(records, risk_model, default_baselines(), horizon=risk_model.horizon)
    print_report(console, report, f"model {risk_model.meta['version']}")
    if report.by_kind and "model" in set(report.kinds_frame()["scorer"]):
        for grouping in ("kind", "cause"):
            title = f"per collapse {grouping}, all sources, at the same budget"
            console.print(_kind_table(report, grouping, title))


def _first_crossings(risk, thresholds: dict) -> dict[str, int | None]:
    from collapse_guard.predictor.levels import LEVELS, alarm_starts

    out = {}
    for level in LEVELS:  # watch, warn, critical: the order a run escalates through
        threshold = thresholds[level]
        starts = alarm_starts(risk.to_numpy(), threshold)
        out[level] = int(risk.index[starts[0]]) if len(starts) else None
    return out


def predict_command(
    run: Annotated[Path, typer.Argument(help="A run file (*.parquet).", exists=True)],
    model: Annotated[str | None, _MODEL] = None,
    plot: Annotated[
        Path | None, typer.Option(help="Write loss, signals and risk over steps to this PNG.")
    ] = None,
) -> None:
    """Per-step risk of one run: first alarm of each level, lead time, and a plot."""
    from rich.console import Console
    from rich.table import Table

    from collapse_guard.datasets.runfile import read_run
    from collapse_guard.predictor.plots import run_risk_plot
    from collapse_guard.predictor.risk import RiskModel

    console = Console()
    frame, meta = read_run(run)
    risk_model = RiskModel.load(model)
    risk = risk_model.predict_run(frame, steps=frame["step"].to_numpy())
    table = Table(title=f"{meta.run_id} ({meta.source}, {len(frame)} steps)")
    for column in ("level", "threshold", "first alarm", "lead time"):
        table.add_column(column, justify="left" if column == "level" else "right")
    onset = meta.onset_step
    for level, step in _first_crossings(risk, risk_model.thresholds).items():
        lead = onset - step if step is not None and onset is not None and step < onset else None
        table.add_row(
            level,
            f"{risk_model.thresholds[level]:.3g}",
            "—" if step is None else str(step),
            "—" if lead is None else f"{lead} steps",
        )
    console.print(table)
    peak = risk.idxmax() if risk.notna().any() else None
    console.print(
        f"onset: {onset if onset is not None else 'none (healthy)'}; peak risk "
        f"{risk.max():.3f} at step {peak}; model {risk_model.meta['version']}"
    )
    if plot is not None:
        run_risk_plot(
            frame,
            risk,
            plot,
            thresholds=risk_model.thresholds,
            onset_step=onset,
            title=f"{meta.run_id}: P(collapse within {risk_model.horizon} steps)",
        )
        console.print(f"plot written to {plot}")
