"""``retrain``: new runs in, a challenger trained, compared fairly, promoted only by the rule.

>>> result = retrain(["runs/new", "s3://bucket/guarded"], base="runs")
>>> result.promoted, result.version, result.reason

Steps. Each is idempotent and its state lives where it is made (the dataset folder, the
MLflow store), so that running the same command again after a crash finishes the job:

==============  ==========================================================================
step            what, and what a rerun finds
==============  ==========================================================================
ingest          new run files (folders, files, fsspec URLs) checked, labelled, guarded
                runs censored, copied into ``<base>/ingested/`` (``runfiles.ingest``);
                a rerun finds them there (same bytes) and does not copy them again
dataset         every readable run under ``<base>``; unreadable files are reported
benchmark       the frozen benchmark (``predictor.lifecycle.benchmark``): recorded in MLflow once,
                reused by every retrain; its runs are never trained on
set-up          new runs holding a collapse are the fleet's set-up: dealt, seeded, into
                held-out runs and calibration runs, neither trained on
                (``predictor.lifecycle.setup_runs``); without a collapse, none set apart
challenger      trained as the champion was (its recorded ``train_config``, the settings
                given over it), on the dataset minus the benchmark and the set-up's runs set
                apart (``train_risk_model``; with ``dask``, the training rows are computed
                on the cluster); its levels set again on the calibration runs (else on
                the new healthy runs it did not train on: ``predictor.core.recalibrate``),
                when there are any; logged and registered with the tag
                ``collapse_guard.retrain_key``: the hash of the training runs' labels, the
                benchmark and the settings
promotion       inside the same logging (``registry.log_training``), each model at its own
                stored ``warn`` level on runs neither trained or validated on: a
                challenger calibrated on the set-up on the set-up's held-out runs (levels
                and recall), the benchmark judging ranking only (ROC-AUC); otherwise on
                the benchmark runs plus the new runs. The ``champion`` alias moves only by
                ``predictor.lifecycle.promotion``'s rule; the figures and verdict are
                logged to the challenger's MLflow run
record          the challenger's run gets the datasets as MLflow inputs (``benchmark``,
                ``training``, ``new``), the ingest report, and ``retrain_state = done``
==============  ==========================================================================

A rerun with the same key finds the earlier attempt: done, it is reported again (nothing
is trained); decided but not recorded (a crash after the verdict), the alias is moved if
the verdict said so and the champion is still the one it beat, then recorded; logged but
not decided (a crash while logging), the attempt is marked abandoned and the challenger
trained again (deterministic: the same seed gives the same model).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from collapse_guard.errors import UserInputError
from collapse_guard.predictor.lifecycle.benchmark import (
    FrozenBenchmark,
    choose_benchmark,
    find_benchmark,
    record_benchmark,
)
from collapse_guard.predictor.lifecycle.setup_runs import SetupRuns, split_setup_runs
from collapse_guard.predictor.training.config import TrainConfig
from collapse_guard.runfiles import RunMeta
from collapse_guard.runfiles.ingest import (
    Dataset,
    IngestReport,
    Rejected,
    dataset_runs,
    discard_ingested,
    ingest_runs,
)
from collapse_guard.runfiles.records import load_runs

__all__ = [
    "KEY_TAG",
    "STATE_TAG",
    "RetrainResult",
    "retrain",
]

KEY_TAG = "collapse_guard.retrain_key"  # which retrain job an MLflow run belongs to
STATE_TAG = "collapse_guard.retrain_state"  # "done" or "abandoned" (unset: in progress)
_DONE, _ABANDONED = "done", "abandoned"
_INGEST_ARTIFACT = "retrain/ingest.json"


@dataclass(frozen=True)
class RetrainResult:
    """What one ``retrain`` did, from ingest to the alias."""

    ingest: IngestReport
    unreadable: tuple[Rejected, ...]  # files under the dataset folder that were not used
    benchmark: FrozenBenchmark
    training_runs: int  # runs the challenger was split and trained on (benchmark excluded)
    mlflow_run_id: str
    version: str  # the challenger's registered version
    previous_champion: str | None
    champion: str | None  # the alias after this retrain
    promoted: bool
    reason: str
    comparison_run_ids: tuple[str, ...]  # runs both were scored on (unseen by both)
    metrics: Mapping[str, float]  # compare.challenger.*, compare.champion.*
    resumed: bool  # an earlier attempt's challenger was used (nothing trained now)
    setup: SetupRuns = field(default_factory=SetupRuns)  # new runs set apart (setup_runs)


def _skipped(report: IngestReport, shown: int = 5) -> str:
    """The skipped files as one line: the first few with their reasons, then counts."""
    parts = [f"{r.name} ({r.reason})" for r in report.rejected[:shown]]
    if len(report.rejected) > shown:
        parts.append(f"{len(report.rejected) - shown} more rejected")
    if report.ignored:
        parts.append(f"{len(report.ignored)} file(s) not *.parquet")
    return "; ".join(parts) or "nothing found"


def _log(progress: Callable[[str], None] | None, message: str) -> None:
    if progress is not None:
        progress(message)


def _retrain_key(
    training: Mapping[str, RunMeta], benchmark: FrozenBenchmark, settings: Mapping[str, Any]
) -> str:
    # the labels of the training runs (their footers, read once by dataset_runs), the
    # benchmark and the settings: the same key means the same challenger trained again
    keys = []
    for run_id in sorted(training):
        meta = training[run_id]
        keys.append(f"{run_id}|{meta.source}|{meta.onset_step}|{meta.label_version}")
    keys.append(f"benchmark|{benchmark.digest}")
    keys.append(json.dumps(dict(settings), sort_keys=True, default=str))
    return hashlib.sha256("\n".join(keys).encode("utf-8")).hexdigest()[:16]


def _client():
    from collapse_guard.predictor.core.store import use_store

    return use_store()


def _attempts(experiment_id: str, key: str) -> list:
    return _client().search_runs(
        [experiment_id],
        filter_string=f"tags.`{KEY_TAG}` = '{key}'",
        order_by=["attributes.start_time DESC"],
    )


def _version_of(run_id: str, model_name: str) -> str | None:
    found = _client().search_model_versions(f"name = '{model_name}' and run_id = '{run_id}'")
    return str(found[0].version) if found else None


def _champion_model(model_name: str):
    from collapse_guard.predictor.core.risk import ModelFormatError, RiskModel
    from collapse_guard.predictor.lifecycle.registry import CHAMPION, champion_version

    if champion_version(model_name) is None:
        return None
    try:
        return RiskModel.load(f"models:/{model_name}@{CHAMPION}")
    except ModelFormatError:
        return None  # a champion this code cannot run sees no run: it excludes none


def _champion_training(model_name: str) -> TrainConfig | None:
    """The champion's training as its meta recorded it; None without a champion or a record."""
    champion = _champion_model(model_name)
    recorded = champion.meta.get("train_config") if champion is not None else None
    return TrainConfig.from_dict(recorded) if recorded else None


def _seen_by_champion(model_name: str, run_ids: Sequence[str]) -> set[str]:
    from collapse_guard.predictor.core.seen_runs import SeenRuns

    champion = _champion_model(model_name)
    if champion is None:
        return set()
    seen = SeenRuns.from_meta(champion.meta)
    return {r for r in run_ids if seen.role_of(r) is not None}


def _benchmark(
    experiment_id: str,
    dataset: Dataset,
    new: Sequence[str],
    base: Path,
    model_name: str,
    seed: int,
) -> FrozenBenchmark:
    """The recorded benchmark; at the first retrain, chosen and recorded now.

    Chosen among the runs that were there before this retrain (the new runs are what the
    challenger is to learn from) and that the champion never trained or validated on.
    """
    found = find_benchmark(experiment_id)
    if found is not None:
        return found
    old = [r for r in dataset.paths if r not in set(new)] or list(dataset.paths)
    exclude = _seen_by_champion(model_name, old)
    ids = choose_benchmark([dataset.metas[r] for r in old], exclude=exclude, seed=seed)
    if not ids and set(old) - exclude:  # runs the champion never saw, too few for a share
        raise UserInputError(
            f"too few runs to train: the dataset folder {base} holds {len(dataset.paths)} runs "
            f"({len(new)} of them new), too few to set a share apart as the frozen benchmark "
            "and train on the rest",
            "give --base the folder of the runs to train on beside the new ones (e.g. "
            "`collapse-guard data synth --n 60 --out runs`)",
        )
    return record_benchmark(experiment_id, ids, base, seed=seed)


def _rows_builder(client):
    from collapse_guard.predictor.training.fleet import rows_on

    return {"rows": rows_on(client)}


def _train(paths: Sequence[Path], config: TrainConfig, dask, progress):
    from collapse_guard.predictor.training.train import train_risk_model

    cluster = nullcontext(None)
    if dask is not None:
        from collapse_guard.predictor.training.fleet import fleet_client

        cluster = fleet_client(dask)
    with cluster as client:
        extra = _rows_builder(client) if client is not None else {}
        return train_risk_model(paths, config, progress=progress, **extra)


def _setup_runs(dataset: Dataset, new: Sequence[str], seed: int, recalibrate: bool):
    """The new runs set apart (``setup_runs``), when they hold a collapse to judge recall on;
    without one, none: they train and calibrate the challenger as any run does."""
    metas = [dataset.metas[r] for r in new if r in dataset.metas]
    if not any(m.onset_step is not None for m in metas):
        return SetupRuns()
    return split_setup_runs(metas, seed=seed, calibrate=recalibrate)


def _recalibrated(result, dataset: Dataset, new: Sequence[str], progress):
    """(the challenger with its levels set on the new healthy runs it did not train on,
    whether any were there).

    They are runs of the set-up the fleet trains now, which levels set on the dataset's
    mix of set-ups need not fit (``predictor.core.recalibrate``); once calibrated on, they are
    validation runs of the model, so promotion does not score it on them.
    """
    from dataclasses import replace

    from collapse_guard.predictor.core.recalibrate import calibrate

    trained = set(result.ids("train"))
    healthy = [
        dataset.paths[r]
        for r in new
        if r in dataset.paths and r not in trained and dataset.metas[r].onset_step is None
    ]
    if not healthy:
        return result, False
    model = calibrate(result.model, healthy)
    _log(progress, f"levels: set on {len(healthy)} new healthy runs it did not train on")
    return replace(result, model=model), True


def _comparison_runs(
    result,
    runs: Mapping[str, Path],
    benchmark: FrozenBenchmark,
    new: Sequence[str],
    setup,
    calibrated: bool,
) -> tuple[list, list]:
    """(the runs promotion judges levels and recall on, the runs it judges ranking on).

    A challenger calibrated on the set-up with held-out runs of it: levels and recall on
    those, ranking on the benchmark (``promotion``, rule 5). Otherwise levels and recall on
    the benchmark's runs, the held-out new runs and the new runs among the challenger's test
    runs, held (and scored) already, and no ranking runs; a new run it trained or validated
    on would only be set apart by promotion (``promotion.unseen_by``), so it is not read
    again."""
    held_out = load_runs([runs[r] for r in setup.held_out if r in runs])
    bench = [runs[r] for r in sorted(benchmark.run_ids) if r in runs and r not in set(new)]
    if setup.held_out and calibrated:
        return held_out, load_runs(bench)
    fresh = set(new)
    held = [r for r in result.test_runs if r.run_id in fresh]
    return sorted([*load_runs(bench), *held, *held_out], key=lambda r: r.run_id), []


def _log_challenger(result, comparison, ranking, key, benchmark, experiment, model_name):
    """Log, register and decide promotion (``registry.log_result``), tagged with the key."""
    from collapse_guard.predictor.lifecycle.registry import log_result

    return log_result(
        result,
        comparison_runs=comparison,
        ranking_runs=ranking,
        params={"kind": "retrain", "trainer": result.model.meta.get("trainer", "lightgbm")},
        experiment=experiment,
        model_name=model_name,
        tags={KEY_TAG: key, "collapse_guard.benchmark_digest": benchmark.digest},
    )


def _take_back(report: IngestReport, base: Path, benchmarks: Sequence[FrozenBenchmark]) -> None:
    """A retrain that failed before its challenger was logged leaves nothing behind: the
    copies this ingest wrote and a benchmark recorded now (a rerun chooses and ingests
    again, the same way: both depend only on the runs and the seed)."""
    discard_ingested(report, base)
    for benchmark in benchmarks:
        _client().delete_run(benchmark.mlflow_run_id)


def _ids_dataset(ids: Sequence[str], name: str, source: Path, digest: str | None = None):
    import mlflow
    from mlflow.data.sources import LocalArtifactDatasetSource

    from collapse_guard.predictor.lifecycle.benchmark import ids_digest

    frame = pd.DataFrame({"run_id": sorted(ids)})
    return mlflow.data.from_pandas(
        frame,
        source=LocalArtifactDatasetSource(str(source)),
        name=name,
        digest=digest or ids_digest(ids),
    )


def _ingest_record(report: IngestReport, unreadable: Sequence[Rejected]) -> dict:
    def ingested(items):
        return [
            {
                "name": i.name,
                "run_id": i.run_id,
                "path": str(i.path),
                "censoring": i.censoring.to_dict() if i.censoring else None,
            }
            for i in items
        ]

    return {
        "ingested": ingested(report.ingested),
        "already": ingested(report.already),
        "rejected": [{"name": r.name, "reason": r.reason} for r in report.rejected],
        "ignored": list(report.ignored),
        "unreadable_in_dataset": [{"name": r.name, "reason": r.reason} for r in unreadable],
    }


def _record(run_id, base, benchmark, training_ids, fingerprint, report, unreadable) -> None:
    """Step 'record' of the module docstring: datasets, ingest report, state done."""
    import mlflow

    from collapse_guard.predictor.lifecycle.benchmark import BENCHMARK_CONTEXT

    _client()
    with mlflow.start_run(run_id=run_id):
        mlflow.log_input(benchmark.dataset(base), context=BENCHMARK_CONTEXT)
        training = _ids_dataset(training_ids, "collapse-guard-training", base, fingerprint)
        mlflow.log_input(training, context="training")
        if report.run_ids:
            mlflow.log_input(_ids_dataset(report.run_ids, "collapse-guard-new", base), "new")
        mlflow.log_dict(_ingest_record(report, unreadable), _INGEST_ARTIFACT)
        mlflow.set_tag(STATE_TAG, _DONE)


def _abandon(run_id: str, model_name: str) -> None:
    """An attempt logged but never decided (a crash while logging): marked, never resumed.

    Its registered version (if it got that far) is tagged too: it never becomes champion.
    """
    client = _client()
    client.set_tag(run_id, STATE_TAG, _ABANDONED)
    version = _version_of(run_id, model_name)
    if version is not None:
        client.set_model_version_tag(model_name, version, STATE_TAG, _ABANDONED)


def _finish_decided(run, model_name: str) -> tuple[str, str | None]:
    """Apply a logged verdict whose alias move may not have happened: (version, champion).

    The alias moves only if the verdict was "promoted" and the champion is still the one
    the challenger beat: never back over a newer promotion.
    """
    from collapse_guard.predictor.lifecycle.registry import CHAMPION, champion_version

    version = _version_of(run.info.run_id, model_name)
    current = champion_version(model_name)
    previous = run.data.tags.get("previous_champion") or None
    if run.data.tags.get("promotion") == "promoted" and current == previous:
        _client().set_registered_model_alias(model_name, CHAMPION, version)
        current = version
    return version, current


def _resumed(run, model_name: str, record: Callable[[str, str], None], **common) -> RetrainResult:
    """Finish a decided attempt (alias, then record) and report it."""
    import mlflow

    version, champion = _finish_decided(run, model_name)
    tags = run.data.tags
    if tags.get(STATE_TAG) != _DONE:
        record(run.info.run_id, tags.get("dataset_fingerprint", ""))
    try:
        logged = mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/promotion.json")
    except Exception:  # no record logged: the tags still tell the verdict
        logged = {}
    return RetrainResult(
        **common,
        mlflow_run_id=run.info.run_id,
        version=version,
        previous_champion=tags.get("previous_champion") or None,
        champion=champion,
        promoted=tags.get("promotion") == "promoted",
        reason=tags.get("promotion_reason", ""),
        comparison_run_ids=tuple(logged.get("comparison_run_ids", ())),
        metrics={k: v for k, v in run.data.metrics.items() if k.startswith("compare.")},
        resumed=True,
    )


def retrain(
    runs: Sequence[str | Path],
    *,
    base: str | Path = "runs",
    experiment: str | None = None,
    model_name: str | None = None,
    config: TrainConfig | None = None,
    dask: str | None = None,
    require_new: bool = False,
    recalibrate: bool = True,
    progress: Callable[[str], None] | None = None,
    on_ingest: Callable[[IngestReport], None] | None = None,
    **settings: Any,
) -> RetrainResult:
    """Ingest ``runs`` into ``base``, train a challenger, compare, promote by the rule.

    Args:
        runs: folders, run files or fsspec URLs of the new runs.
        base: the dataset folder: every run the models are trained on lives under it
            (new runs are copied into ``<base>/ingested/``).
        experiment: MLflow experiment (default ``collapse-guard``); the store is
            ``MLFLOW_TRACKING_URI`` (else ``./mlruns``).
        model_name: registered model (default ``collapse-predictor``).
        config: the challenger's training (``TrainConfig``, ``settings`` over it: seed,
            stride, hold_steps, params, budgets, ...); its ``seed`` also draws the frozen
            benchmark, its ``horizon`` is how far before a guard's first intervention a
            guarded run's rows stay labelled (``runfiles.censoring``). None: the
            champion's own training (its ``train_config``), so that a challenger differs
            from it by the runs, not by the method; the defaults without a champion.
        dask: train on Dask: ``"local"`` or a scheduler address (``predictor.training.fleet``).
        require_new: raise ``UserInputError`` when no run among ``runs`` is accepted
            (the command: a retrain on nothing new is a mistake, not a job).
        recalibrate: set the challenger's levels on the new healthy runs it did not train
            on (``recalibrate.calibrate``); False keeps the levels of its validation runs.
        progress: called with a line of text after each step.
        on_ingest: called with the ingest's report as soon as it is done (the command
            names the files it skipped before training starts, whatever follows).

    A retrain that fails before its challenger is logged (too few runs, a bad setting)
    leaves no file behind: the copies it ingested and a benchmark it recorded are taken
    back. A failure after that is a crash: the copies stay, and a rerun finishes the job.
    """
    from collapse_guard.predictor.lifecycle.registry import DEFAULT_EXPERIMENT, MODEL_NAME

    experiment = experiment or DEFAULT_EXPERIMENT
    model_name = model_name or MODEL_NAME
    config = TrainConfig.of(config or _champion_training(model_name), **settings)
    base = Path(base)
    report = ingest_runs(runs, base, horizon=config.horizon)
    _log(
        progress,
        f"ingest: {len(report.ingested)} new, {len(report.already)} already in {base}, "
        f"{len(report.rejected)} rejected, {len(report.ignored)} ignored",
    )
    if on_ingest is not None:
        on_ingest(report)
    if require_new and not report.run_ids:
        raise UserInputError(
            f"no run file could be ingested from {', '.join(map(str, runs))}: " + _skipped(report),
            "pass folders, files or URLs of collapse-guard run files (*.parquet)",
        )
    job = _Job(report, base, config, experiment, model_name, recalibrate, dask, progress)
    try:
        return job.run()
    except BaseException:
        if not job.logging:  # nothing in the store refers to the copies yet
            _take_back(report, base, job.recorded)
        raise


@dataclass
class _Job:
    """One retrain after its ingest: the steps of the module docstring from 'dataset' on.

    ``logging`` turns True once the challenger's logging begins: from then on a failure is
    a crash a rerun finishes, so the copies stay; before it, ``retrain`` takes back the
    copies and the benchmark ``recorded`` now."""

    report: IngestReport
    base: Path
    config: TrainConfig
    experiment: str
    model_name: str
    recalibrate: bool
    dask: str | None
    progress: Callable[[str], None] | None
    logging: bool = False
    recorded: list = field(default_factory=list)

    def run(self) -> RetrainResult:
        from collapse_guard.predictor.lifecycle.registry import champion_version, ensure_experiment

        report, base, progress, model_name = self.report, self.base, self.progress, self.model_name
        seed, new = self.config.seed, report.run_ids
        dataset = dataset_runs(base)
        unreadable = dataset.unreadable
        experiment_id = ensure_experiment(self.experiment)
        benchmark = _benchmark(experiment_id, dataset, new, base, model_name, seed)
        if benchmark.created:
            self.recorded.append(benchmark)
        _log(
            progress,
            f"frozen benchmark: {len(benchmark.run_ids)} runs "
            f"({'chosen now' if benchmark.created else 'recorded earlier'}, {benchmark.digest})",
        )
        setup = _setup_runs(dataset, new, seed, self.recalibrate)
        apart = set(benchmark.run_ids) | setup.apart
        training = {r: p for r, p in dataset.paths.items() if r not in apart}
        key = _retrain_key(
            {r: dataset.metas[r] for r in training},
            benchmark,
            {
                **self.config.to_dict(),
                "model": model_name,
                "recalibrate": self.recalibrate,
                "setup": [setup.held_out, setup.calibration],
            },
        )
        common = {
            "ingest": report,
            "unreadable": tuple(unreadable),
            "benchmark": benchmark,
            "training_runs": len(training),
            "setup": setup,
        }

        def record(run_id: str, fingerprint: str) -> None:
            _record(run_id, base, benchmark, sorted(training), fingerprint, report, unreadable)

        for attempt in _attempts(experiment_id, key):
            state = attempt.data.tags.get(STATE_TAG)
            if state == _ABANDONED:
                continue
            if "promotion" in attempt.data.tags:
                _log(progress, f"this retrain was decided before: MLflow run {attempt.info.run_id}")
                return _resumed(attempt, model_name, record, **common)
            _abandon(attempt.info.run_id, model_name)
        result = _train(sorted(training.values()), self.config, self.dask, progress)
        calibrated = False
        if self.recalibrate:
            result, calibrated = _recalibrated(result, dataset, setup.calibration or new, progress)
        comparison, ranking = _comparison_runs(
            result, dataset.paths, benchmark, new, setup, calibrated
        )
        self.logging = True
        logged = _log_challenger(
            result, comparison, ranking, key, benchmark, self.experiment, model_name
        )
        _log(progress, f"v{logged.version}: {'promoted' if logged.promoted else 'kept out'}")
        record(logged.run_id, result.fingerprint)
        decision = logged.decision
        return RetrainResult(
            **common,
            mlflow_run_id=logged.run_id,
            version=str(logged.version),
            previous_champion=logged.previous_champion,
            champion=champion_version(model_name),
            promoted=logged.promoted,
            reason=logged.reason,
            comparison_run_ids=tuple(decision.run_ids) if decision else (),
            metrics=decision.to_metrics() if decision else {},
            resumed=False,
        )
