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
    "holdout_table",
    "predict_command",
    "print_groups",
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


def _fmt(value, digits: int = 3) -> str:
    return "—" if value is None or value != value else f"{value:.{digits}g}"


def _rate(value) -> str:
    # a false-alarm rate: whole numbers past 10 (211, not 2.1e+02), two digits below
    if value is None or value != value:
        return "—"
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"


# where each threshold came from, in a table's words (evaluation.report)
_FITTED_ON = {"validation": "val", "rule": "rule", "test": "test*"}
_FITTED_NOTE = (
    "rec = recall, hit = caught / collapses, lead = median steps ahead, FA = false alarms "
    "per 10k healthy steps, AP = average precision. set on: val = validation runs (stored "
    "level, tuned baseline), rule = the original's own rule; test* = threshold fitted on "
    "these test runs for the same false-alarm rate (ROC-like, secondary)"
)


def _scorer_table(report, title: str, source: str = "all"):
    """Rich table: each scorer at its out-of-sample point (the model at its stored levels,
    a rule as it fires, a tuned baseline at its validation threshold), then every scorer at
    a threshold fitted on these test runs for the same false-alarm rate (ROC-like).

    ``lead`` is the median lead time of caught collapses, in steps.
    """
    from rich import box
    from rich.table import Table

    # SIMPLE_HEAD and short headers: the table must fit 80 columns (rich's width off a tty)
    table = Table(title=title, caption=_FITTED_NOTE, box=box.SIMPLE_HEAD, pad_edge=False)
    headers = ("scorer", "point", "set on", "rec", "hit", "lead", "FA")
    for column in (*headers, "AP", "Brier"):
        text = column in ("scorer", "point", "set on")
        table.add_column(column, justify="left" if text else "right", no_wrap=text)
    frame = report.to_frame()
    frame = frame[frame["source"] == source]
    stored = frame[frame["fitted_on"] != "test"]
    fitted = frame[frame["fitted_on"] == "test"]
    for part in (stored, fitted):
        for r in part.itertuples():
            headline = r.scorer == "model" and r.operating_point == "level:warn"
            table.add_row(
                r.scorer,
                r.operating_point.removeprefix("level:"),
                _FITTED_ON[r.fitted_on],
                _fmt(r.recall, 2),
                f"{r.caught}/{r.n_collapsed}",
                _fmt(r.median_lead),
                _fmt(r.fa_per_10k),
                _fmt(r.pr_auc, 2),
                _fmt(r.brier, 2),
                style="bold" if headline else None,
                end_section=part is stored and r.Index == stored.index[-1],
            )
    return table


def _budget_table(report, title: str):
    """Rich table: do the stored levels hold their false-alarm budgets, per source?"""
    from rich import box
    from rich.table import Table

    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("source", "level", "budget/10k", "FA/10k", "false alarms", "within 2x"):
        table.add_column(column, justify="left" if column in ("source", "level") else "right")
    for c in report.budget_checks:
        holds = {True: "yes", False: "[red]no[/]", None: "too few steps"}[c.holds]
        table.add_row(
            c.source,
            c.level,
            _fmt(c.budget_per_10k),
            _fmt(c.fa_per_10k),
            f"{c.false_alarms} in {c.healthy_steps} steps",
            holds,
        )
    return table


def print_report(console, report, heading: str) -> None:
    """Print the scorer table for all sources pooled, then per source when there are
    several, then whether the stored levels hold their budgets."""
    sources = sorted(set(report.to_frame()["source"]) - {"all"})
    budget = f"test* at {report.budget_per_10k:g} FA/10k"
    console.print(_scorer_table(report, f"{heading}: all sources ({budget})"))
    if len(sources) > 1:
        for source in sources:
            console.print(_scorer_table(report, f"{heading}: {source}", source=source))
    if report.budget_checks:
        factor = "stored levels within 2x of their budgets?"
        console.print(_budget_table(report, f"{heading}: {factor}"))


def _group_table(report, grouping: str, title: str):
    """Rich table: per group, the model's recall and lead at its stored warn level beside
    the best baseline at its own point (``grouping``: kind, cause, onset, family, ...)."""
    from rich import box
    from rich.table import Table

    wide = report.group_table(grouping)
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
    for group, row in wide.iterrows():
        recalls = {
            b: row[f"{b} recall"] for b in baselines if row[f"{b} recall"] == row[f"{b} recall"]
        }
        best = max(recalls, key=recalls.get, default=None)
        table.add_row(
            str(group),
            str(row["n"]),
            _fmt(row.get("model recall")),
            _fmt(row.get("model lead")),
            "—" if best is None or not recalls[best] else f"{best} {_fmt(recalls[best])}",
        )
    return table


def print_groups(console, report) -> None:
    """Per collapse kind, cause and onset (sudden / develops), and per model family,
    optimizer and data where the runs hold more than one."""
    from collapse_guard.predictor.evaluation import COLLAPSE_GROUPINGS, SETUP_GROUPINGS

    if "model" not in report.scorers:
        return
    frame = report.groups_frame()
    for grouping in (*COLLAPSE_GROUPINGS, *SETUP_GROUPINGS):
        present = set(frame.loc[frame["grouping"] == grouping, "group"])
        if grouping in SETUP_GROUPINGS and len(present) < 2:
            continue
        title = f"per {grouping}: model at warn, baselines at their own points"
        console.print(_group_table(report, grouping, title))


def holdout_table(holdout, title: str):
    """Rich table: one row per scorer, one column per held-out group and the mean; each
    cell 'recall (median lead) @false alarms per 10k healthy steps'."""
    from rich import box
    from rich.table import Table

    recall, lead = holdout.wide("recall"), holdout.wide("median_lead")
    fa = holdout.wide("fa_per_10k")
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("scorer", no_wrap=True)
    for group in recall.index:
        table.add_column(str(group), justify="right", no_wrap=True)
    for scorer in recall.columns:
        cells = []
        for group in recall.index:
            r, lead_, fa_ = (f.loc[group, scorer] for f in (recall, lead, fa))
            cells.append("—" if r != r else f"{r:.2f} ({_fmt(lead_)}) @{_rate(fa_)}")
        table.add_row(scorer, *cells, style="bold" if scorer == "model" else None)
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


def _fail(console, message: str) -> None:
    # one line and exit code 2, as the other commands' bad input
    console.print(f"[red]error:[/red] {message}", soft_wrap=True)
    raise typer.Exit(2)


def evaluate_command(
    runs: Annotated[list[Path], _RUNS],
    model: Annotated[str | None, _MODEL] = None,
    unseen_only: Annotated[
        bool,
        typer.Option(
            help="Score only the runs the model never saw; its training and validation "
            "runs among those given fit the learned baselines."
        ),
    ] = False,
    include_seen: Annotated[
        bool,
        typer.Option(help="Also score the runs the model trained or validated on, apart."),
    ] = False,
    leave_one_out: Annotated[
        str | None,
        typer.Option(
            help="Train without each model 'family' (or 'optimizer', 'data') and test on it; "
            "--model is not used then."
        ),
    ] = None,
    synthetic: Annotated[
        bool, typer.Option(help="With --leave-one-out: train on synthetic runs too.")
    ] = True,
    budget: Annotated[
        float, typer.Option(help="False alarms per 10k healthy steps of the ROC-like rows.")
    ] = 1.0,
) -> None:
    """Evaluate a model beside the baselines on runs it never saw, per source.

    The headline is the model at its stored `warn` level (set on validation runs at
    training). Runs the model trained or validated on (their ids are in the model) are
    refused: pass --unseen-only to score the others, or --include-seen to see them apart.
    """
    from rich.console import Console

    from collapse_guard.predictor.baselines import default_baselines
    from collapse_guard.predictor.evaluation import evaluate_runs
    from collapse_guard.predictor.seen_runs import SeenRuns
    from collapse_guard.predictor.training_data import load_runs

    console = Console()
    if budget <= 0:
        _fail(console, f"--budget must be a positive number of false alarms per 10k; got {budget}")
    records = load_runs(run_paths(runs))
    if leave_one_out is not None:
        if model is not None:
            console.print("note: --leave-one-out trains its own models; --model is not used")
        _leave_one_out(console, records, leave_one_out, synthetic=synthetic, budget=budget)
        return

    from collapse_guard.predictor.risk import RiskModel

    risk_model = RiskModel.load(model)
    name = risk_model.meta["version"]
    seen_runs = SeenRuns.from_meta(risk_model.meta)
    if not seen_runs.known:
        console.print(
            f"[yellow]warning:[/] model {name} stores no training or validation run ids (trained "
            "before they were recorded): make sure these runs are not ones it trained on"
        )
    unseen, seen = seen_runs.partition(r.run_id for r in records)
    n_seen = sum(len(v) for v in seen.values())
    if n_seen and not (unseen_only or include_seen):
        _fail(
            console,
            f"{n_seen} of the {len(records)} runs given were used to train ({len(seen['train'])}) "
            f"or validate ({len(seen['validation'])}) model {name}: scoring it on them "
            "overstates it. Fix: pass runs it never saw, or --unseen-only to score only "
            "those, or --include-seen to see the seen ones apart",
        )
    by_id = {r.run_id: r for r in records}
    test = [by_id[i] for i in unseen]
    if not test:
        _fail(
            console,
            f"all {len(records)} runs given were used to train or validate model {name}; "
            "fix: pass runs it never saw (e.g. `collapse-guard data synth --seed 7`)",
        )
    train = [by_id[i] for i in seen["train"]]
    validation = [by_id[i] for i in seen["validation"]]
    console.log(f"{risk_model!r} on {len(test)} runs it never saw ({n_seen} seen runs set apart)")
    horizon = risk_model.horizon
    # the learned baselines need the model's own training and validation runs (not a test)
    baselines = default_baselines(
        train or None, validation or None, horizon=horizon, budget_per_10k=budget
    )
    report = evaluate_runs(test, risk_model, baselines, horizon=horizon, budget_per_10k=budget)
    print_report(console, report, f"model {name}, unseen runs")
    print_groups(console, report)
    if include_seen and n_seen:
        seen_report = evaluate_runs(
            train + validation,
            risk_model,
            default_baselines(),
            horizon=horizon,
            budget_per_10k=budget,
        )
        print_report(
            console, seen_report, f"NOT A TEST: model {name} on runs it trained or validated on"
        )


def _leave_one_out(console, records, grouping: str, *, synthetic: bool, budget: float) -> None:
    from collapse_guard.predictor.evaluation import SETUP_GROUPINGS, leave_one_group_out

    if grouping not in SETUP_GROUPINGS:
        _fail(
            console,
            f"--leave-one-out must be one of {', '.join(SETUP_GROUPINGS)}; got {grouping!r}",
        )
    try:
        holdout = leave_one_group_out(
            records, by=grouping, synthetic=synthetic, budget_per_10k=budget, progress=console.log
        )
    except ValueError as error:
        _fail(console, str(error))
    title = (
        f"leave-one-{grouping}-out: recall (median lead) @FA/10k on each held-out {grouping}; "
        "model at its stored warn level, rules as they fire, tuned baselines at their "
        "validation thresholds"
    )
    console.print(holdout_table(holdout, title))


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
