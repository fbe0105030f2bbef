"""``collapse-guard train | evaluate | predict``, as functions that ``collapse_guard.cli`` mounts.

Bad input (a missing ``--runs`` folder, too few runs, a wrong ``--model``) is a
``UserInputError``, raised here or by the library: the ``collapse-guard`` app prints it as
one line and exits with code 2.

Heavy imports (mlflow, lightgbm, pandas, dask) happen inside the bodies, so that
``collapse-guard --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from collapse_guard.errors import UserInputError
from collapse_guard.predictor.cli.options import (
    HOLD,
    POSITIVES,
    RISE_WEIGHT,
    SEED,
    STRIDE,
    train_config,
)

# light: rich is imported only when a table is built
from collapse_guard.predictor.cli.tables import (
    holdout_groups_table,
    holdout_rise_table,
    holdout_table,
    print_groups,
    print_report,
)
from collapse_guard.predictor.core.model_source import (
    MODEL_HELP,
    load_risk_model,
    resolve_model_source,
)

if TYPE_CHECKING:
    from collapse_guard.predictor.core.levels import Level

__all__ = ["evaluate_command", "predict_command", "train_command"]

_RUNS = typer.Option(
    "--runs",
    help="Folders of run files (*.parquet, searched recursively) or run files: "
    "--runs A B or --runs A --runs B.",
)
_MODEL = typer.Option("--model", help=MODEL_HELP)


def train_command(
    runs: Annotated[list[Path], _RUNS],
    experiment: Annotated[str, typer.Option(help="MLflow experiment name.")] = "collapse-guard",
    seed: Annotated[int, SEED] = 0,
    stride: Annotated[int | None, STRIDE] = None,
    hold_steps: Annotated[int | None, HOLD] = None,
    positives_within: Annotated[int | None, POSITIVES] = None,
    healthy_rise_weight: Annotated[float | None, RISE_WEIGHT] = None,
    dask: Annotated[
        str | None,
        typer.Option(
            help="Compute the training rows on Dask: 'local' (2-worker cluster) or a "
            "scheduler address; the fit is the same as without."
        ),
    ] = None,
    register: Annotated[
        bool, typer.Option(help="Register in MLflow as collapse-predictor; promote if better.")
    ] = True,
) -> None:
    """Train a risk model, log it to MLflow, register it and promote it if it beats the champion.

    Promotion: both models at their own stored warn level on the new test runs the
    champion never saw; the new one must catch more collapses within its false-alarm
    budget. Tracking store: MLFLOW_TRACKING_URI, else SQLite at ./mlruns/mlflow.db.
    """
    from contextlib import nullcontext

    from rich.console import Console

    from collapse_guard.predictor.core import store
    from collapse_guard.predictor.lifecycle import registry
    from collapse_guard.predictor.training.train import train_risk_model
    from collapse_guard.runfiles.records import find_run_files

    config = train_config(
        seed=seed,
        stride=stride,
        hold_steps=hold_steps,
        positives_within=positives_within,
        healthy_rise_weight=healthy_rise_weight,
    )
    console = Console()
    paths = find_run_files(runs)
    console.log(f"{len(paths)} run files")
    if dask:
        from collapse_guard.predictor.training import fleet

        cluster = fleet.fleet_client(dask)
    else:
        cluster = nullcontext()
    with cluster as client:
        rows = {"rows": fleet.rows_on(client)} if dask else {}
        result = train_risk_model(paths, config, progress=console.log, **rows)
    print_report(console, result.report, "test runs")
    record = registry.log_result(
        result,
        params={"n_run_files": len(paths), "dask": dask or "no"},
        experiment=experiment,
        register=register,
    )
    console.print(
        f"MLflow run {record.run_id} in experiment {experiment!r}, store {store.tracking_uri()}"
    )
    if record.version is None:
        console.print("not registered (--no-register)")
    elif record.promoted:
        console.print(f"[green]registered v{record.version}, now champion[/]: {record.reason}")
    else:
        console.print(
            f"[yellow]registered v{record.version}; champion stays v{record.previous_champion}"
            f"[/]: {record.reason}"
        )


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
    seed: Annotated[
        int,
        typer.Option(
            help="With --leave-one-out: seeds each model's split and LightGBM (figures "
            "move between seeds; compare methods over several)."
        ),
    ] = 0,
    stride: Annotated[int | None, STRIDE] = None,
    hold_steps: Annotated[int | None, HOLD] = None,
    positives_within: Annotated[int | None, POSITIVES] = None,
    healthy_rise_weight: Annotated[float | None, RISE_WEIGHT] = None,
    reference: Annotated[
        bool,
        typer.Option(
            help="With --model: score the bundled model on the same runs too, as the "
            "reference rows 'bundled'."
        ),
    ] = True,
) -> None:
    """Evaluate a model beside the baselines on runs it never saw, per source.

    The headline is the model at its stored `warn` level (set on validation runs at
    training); a model of your own is shown beside the bundled one. Runs the model trained
    or validated on (their ids are in the model) are refused: pass --unseen-only to score
    the others, or --include-seen to see them apart. Runs that carry no label (recorded by
    Probe.record_to) are labelled now, by the rule the data generators use.
    """
    from rich.console import Console

    from collapse_guard.predictor.core.seen_runs import SeenRuns
    from collapse_guard.predictor.evaluate import evaluate_runs
    from collapse_guard.predictor.evaluate.baselines import default_baselines
    from collapse_guard.runfiles.records import find_run_files, load_runs

    console = Console()
    if budget <= 0:
        raise UserInputError(
            f"--budget must be a positive number of false alarms per 10k; got {budget}",
            "e.g. --budget 1",
        )
    # --leave-one-out's models train as `collapse-guard train` would, on these settings
    config = train_config(
        seed=seed,
        stride=stride,
        hold_steps=hold_steps,
        positives_within=positives_within,
        healthy_rise_weight=healthy_rise_weight,
        eval_budget_per_10k=budget,
    )
    records = _labelled_records(console, load_runs(find_run_files(runs)))
    if leave_one_out is not None:
        if model is not None:
            console.print("note: --leave-one-out trains its own models; --model is not used")
        _leave_one_out(console, records, leave_one_out, config, synthetic=synthetic)
        return

    risk_model = load_risk_model(model)
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
        raise UserInputError(
            f"{n_seen} of the {len(records)} runs given were used to train ({len(seen['train'])}) "
            f"or validate ({len(seen['validation'])}) model {name}: scoring it on them "
            "overstates it",
            "pass runs it never saw, or --unseen-only to score only those, or --include-seen "
            "to see the seen ones apart",
        )
    by_id = {r.run_id: r for r in records}
    test = [by_id[i] for i in unseen]
    if not test:
        raise UserInputError(
            f"all {len(records)} runs given were used to train or validate model {name}",
            "pass runs it never saw (e.g. `collapse-guard data synth --seed 7`)",
        )
    train = [by_id[i] for i in seen["train"]]
    validation = [by_id[i] for i in seen["validation"]]
    console.log(f"{risk_model!r} on {len(test)} runs it never saw ({n_seen} seen runs set apart)")
    horizon = risk_model.horizon
    # the learned baselines need the model's own training and validation runs (not a test)
    baselines = default_baselines(
        train or None, validation or None, horizon=horizon, budget_per_10k=budget
    )
    if reference and resolve_model_source(model) is not None:  # not the bundled model itself
        baselines = [*_reference(console, risk_model, test), *baselines]
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


def _labelled_records(console, records):
    """The records with the runs that carry no label labelled now, said in one line."""
    from collapse_guard.runfiles.label import RULE_NAME
    from collapse_guard.runfiles.records import label_unlabelled_runs

    records, labelled = label_unlabelled_runs(records)
    if labelled:
        named = ", ".join(labelled[:3]) + (
            f" and {len(labelled) - 3} more" if len(labelled) > 3 else ""
        )
        console.print(
            f"{len(labelled)} of the {len(records)} runs carry no label ({named}): labelled "
            f"now by {RULE_NAME}"
        )
    return records


def _reference(console, risk_model, test) -> list:
    """The bundled model as the reference scorer (none where the comparison is unfair),
    said in one line."""
    from collapse_guard.predictor.evaluate.reference import reference_scorer

    scorer, note = reference_scorer(risk_model, [r.run_id for r in test])
    if note:
        console.print(f"{note}; --no-reference leaves it out" if scorer else note)
    return [scorer] if scorer else []


def _leave_one_out(console, records, grouping: str, config, *, synthetic: bool) -> None:
    from collapse_guard.predictor.evaluate import SETUP_GROUPINGS
    from collapse_guard.predictor.training.holdout import leave_one_group_out

    if grouping not in SETUP_GROUPINGS:
        raise UserInputError(
            f"--leave-one-out must be one of {', '.join(SETUP_GROUPINGS)}; got {grouping!r}"
        )
    try:
        holdout = leave_one_group_out(
            records, config, by=grouping, synthetic=synthetic, progress=console.log
        )
    except ValueError as error:  # e.g. a grouping with one value: nothing to hold out
        raise UserInputError(f"--leave-one-out {grouping}: {error}") from error
    title = (
        f"leave-one-{grouping}-out: recall (median lead) @FA/10k on each held-out {grouping}; "
        "model at its stored warn level, rules as they fire, tuned baselines at their "
        "validation thresholds"
    )
    console.print(holdout_table(holdout, title))
    roc_like = (
        f"ROC-like (secondary): every scorer at a threshold fitted on each held-out "
        f"{grouping}'s runs for {config.eval_budget_per_10k:g} false alarms per 10k healthy steps"
    )
    console.print(holdout_table(holdout, roc_like, "budget"))
    inside = (
        f"leave-one-{grouping}-out inside LR rises (the LR rose within the last "
        f"{config.horizon} steps) and outside: model at its stored warn level, false alarms "
        "per 10k healthy steps and step ROC-AUC on each held-out "
        f"{grouping}"
    )
    console.print(holdout_rise_table(holdout, inside))
    # which collapses a model misses on a set-up it never saw (issue 8)
    for by in ("onset", "cause", *(g for g in SETUP_GROUPINGS if g != grouping)):
        title = f"model at its stored warn level per {by}: recall (caught/collapses)" + (
            " @FA/10k of its runs" if by in SETUP_GROUPINGS else ""
        )
        console.print(holdout_groups_table(holdout, by, title))


def _first_crossings(risk, thresholds: dict) -> dict[Level, int | None]:
    from collapse_guard.predictor.core.levels import LEVELS, alarm_starts

    out = {}
    for level in LEVELS:  # watch, warn, critical: the order a run escalates through
        threshold = thresholds[level]
        starts = alarm_starts(risk.to_numpy(), threshold)
        out[level] = int(risk.index[starts[0]]) if len(starts) else None
    return out


def _labelled_now(meta) -> str:
    """What predict says of a label found now: by which rule, on which steps."""
    from collapse_guard.runfiles.label import RULE_NAME

    first_act = meta.extra.get("censoring", {}).get("first_intervention")
    # a guarded run is labelled as training reads it: what the guard changed is no evidence
    on = (
        ""
        if first_act is None
        else f", as training reads a run the guard acted on at step {first_act}"
    )
    return f"the run file carries no onset: labelled now by {RULE_NAME}{on}"


def predict_command(
    run: Annotated[Path, typer.Argument(help="A run file (*.parquet).", exists=True)],
    model: Annotated[str | None, _MODEL] = None,
    plot: Annotated[
        Path | None, typer.Option(help="Write loss, signals and risk over steps to this PNG.")
    ] = None,
) -> None:
    """Per-step risk of one run: first alarm of each level, lead time, and a plot.

    A run that carries no label (recorded by Probe.record_to) is labelled now, by the
    rule the data generators use, so that the lead time is shown."""
    from rich.console import Console
    from rich.table import Table

    from collapse_guard.predictor.evaluate.plots import run_risk_plot
    from collapse_guard.runfiles import read_run
    from collapse_guard.runfiles.label import is_unlabelled
    from collapse_guard.runfiles.records import run_label

    if plot is not None and not plot.parent.is_dir():  # before the scoring; never made here
        raise UserInputError(
            f"--plot {plot}: the folder {plot.parent} does not exist",
            "create it first, or pass a path in an existing folder",
        )
    console = Console()
    frame, meta = read_run(run)
    meta, labelled_now = run_label(frame, meta)
    risk_model = load_risk_model(model)
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
    if onset is not None:
        said = str(onset)
    elif is_unlabelled(meta):
        said = "not labelled (the run records no loss to label it by; no onset to compare with)"
    else:
        said = "none (healthy)"
    console.print(
        f"onset: {said}; peak risk "
        f"{risk.max():.3f} at step {peak}; model {risk_model.meta['version']}"
    )
    if labelled_now:
        console.print(_labelled_now(meta))
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
