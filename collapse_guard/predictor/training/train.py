"""train_risk_model: run files in, a calibrated RiskModel and its evaluation out.

Steps (each its own function in this package, so fleet-scale training can swap one):

1. read the runs and split them by run (``training.data.split_runs``): train /
   validation / test, stratified by outcome and source, seeded;
2. features at every ``stride``-th step of train and validation runs;
3. fit the LightGBM ``CollapsePredictor`` on train rows (the healthy rows inside an LR
   rise weighed ``healthy_rise_weight``: ``training.data.healthy_rise_weights``),
   early-stopping on validation rows;
4. calibrate on validation rows (``calibration.Calibrator``);
5. set the level thresholds from false-alarm budgets on healthy steps scored at every
   step (all of a healthy run, a collapsing one's before onset - horizon), the risk
   held over ``hold_steps`` (``levels.thresholds_from_budgets``, ``hold``): each
   family's runs scored by a model fitted without that family (``crossfit``), each
   family holding the budget on its own, so that the levels hold on a set-up the model
   never saw; the validation runs when that cannot be done;
6. evaluate on the test runs, every step, beside the baselines (``evaluate``).

Memory: the test runs' frames (the train and validation runs are read from their files
when used: ``RunRecord.stored``) and one copy of the training rows
(``build_training_data`` writes them in place). Beyond :data:`MAX_TRAIN_ROWS` training
rows the row stride grows until they fit (``row_stride``; evaluation still scores every
step). Measured: benchmarks/README.md.

Progress: with ``progress`` given, a rich bar counts the runs whose feature rows are
done, and a line says when each longer stage (fit, levels, baselines, evaluation)
starts.

Deterministic: the same runs and seed give the same model string. No MLflow here
(``predictor.lifecycle.registry`` logs what this returns: one :class:`TrainingResult`, the model,
its evaluation, the split's run records, the data fingerprint and the test runs, so that
no caller reads the run files again).

Fleet scale: ``rows`` builds the training rows of step 2; ``predictor.training.fleet`` passes a
builder that computes them on Dask workers. Everything else is this module's code, so
the local and the Dask path fit the same model from the same rows. The model's meta keeps the split
(``split``) and the ids it trained and validated on (``train_run_ids``,
``validation_run_ids``; ``predictor.core.seen_runs``), so that no later evaluation grades it
on them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import lightgbm as lgb
import numpy as np

from collapse_guard.features import FeatureExtractor
from collapse_guard.predictor.core.calibration import Calibrator
from collapse_guard.predictor.core.levels import DEFAULT_BUDGETS, LEVELS, thresholds_from_budgets
from collapse_guard.predictor.core.model import CollapsePredictor
from collapse_guard.predictor.core.risk import RiskModel
from collapse_guard.predictor.core.seen_runs import stored_ids
from collapse_guard.predictor.evaluate import (
    EvalReport,
    ModelScorer,
    evaluate_runs,
    kind_of,
    setup_of,
)
from collapse_guard.predictor.evaluate.baselines import default_baselines
from collapse_guard.predictor.evaluate.events import ScoredRun, healthy_sequences
from collapse_guard.predictor.evaluate.groups import held_out_group
from collapse_guard.predictor.training.config import TrainConfig
from collapse_guard.predictor.training.crossfit import cross_fitted_scores
from collapse_guard.predictor.training.data import (
    RowCache,
    RunSplit,
    TrainingData,
    build_training_data,
    healthy_rise_weights,
    near_positives,
    require_trainable_split,
    split_runs,
)
from collapse_guard.runfiles.records import RunRecord, data_fingerprint, load_runs

__all__ = [
    "MAX_TRAIN_ROWS",
    "RowBuilder",
    "SplitRecord",
    "TrainingResult",
    "fit_and_level",
    "fit_risk_model",
    "row_stride",
    "set_levels",
    "train_risk_model",
]

# (runs, extractor, *, stride, horizon, progress) -> TrainingData: build_training_data,
# or predictor.training.fleet's builder that computes the same rows on Dask workers; progress()
# is called once per run done
RowBuilder = Callable[..., TrainingData]

# Training rows held at most, before the stride grows (``row_stride``): 500k rows of
# ~240 float64 features are ~1 GB, where thousands of synthetic runs at stride 10 give
# millions (benchmarks/README.md, "training memory"). Neighbouring windows share 199 of
# 200 steps, so a stride of 25 instead of 10 drops little that the model could learn.
MAX_TRAIN_ROWS = 500_000


@dataclass(frozen=True)
class SplitRecord:
    """One run of a training's split: who it is, its label, and the role it played."""

    run_id: str
    source: str
    role: str  # "train", "validation" or "test"
    onset_step: int | None  # the label: first step of collapse, None when healthy
    label_version: str | None
    family: str  # model family (evaluate.groups.setup_of); "synthetic" for synthetic runs
    kind: str | None  # collapse kind (evaluate.groups.kind_of); None when healthy

    @property
    def collapsed(self) -> bool:
        return self.onset_step is not None

    @classmethod
    def of(cls, run: RunRecord, role: str) -> SplitRecord:
        meta = run.meta
        return cls(
            run_id=run.run_id,
            source=meta.source,
            role=role,
            onset_step=meta.onset_step,
            label_version=meta.label_version,
            family=setup_of(meta, "family"),
            kind=kind_of(meta),
        )


@dataclass(frozen=True)
class TrainingResult:
    """What one training produced: :func:`train_risk_model`'s single return value.

    ``fingerprint`` is ``runfiles.records.data_fingerprint`` of every run read (also the
    model's ``meta["data_fingerprint"]``); ``test_runs`` are the test split in memory,
    in split order, for whoever scores the model or a rival on them next (promotion).
    """

    model: RiskModel
    config: TrainConfig  # as fitted (its stride raised when the rows would not fit)
    report: EvalReport
    runs: tuple[SplitRecord, ...]
    fingerprint: str
    test_runs: tuple[RunRecord, ...] = field(repr=False)

    def ids(self, role: str) -> list[str]:
        """Run ids of one role ("train", "validation" or "test"), sorted."""
        return sorted(r.run_id for r in self.runs if r.role == role)

    def counts(self) -> dict[str, int]:
        """Runs per role."""
        return {role: len(self.ids(role)) for role in ("train", "validation", "test")}


def _log(progress: Callable[[str], None] | None, message: str) -> None:
    if progress is not None:
        progress(message)


def row_stride(
    runs: Sequence[RunRecord], stride: int, horizon: int, max_rows: int = MAX_TRAIN_ROWS
) -> int:
    """``stride``, or the smallest larger one that keeps the training rows of ``runs``
    (every stride-th step before onset, as ``build_training_data``) within ``max_rows``."""
    # at most ceil(rows / s) training rows per run at stride s (fewer: onset cuts them)
    lengths = [r.n_rows for r in runs]
    while sum(-(-n // stride) for n in lengths) > max_rows:
        stride += 1
    return stride


def _rows(rows: RowBuilder, runs, extractor, label: str, progress, **kwargs) -> TrainingData:
    """``rows(runs, ...)`` under a rich bar of the runs done, when progress is wanted."""
    from collapse_guard.datasets.parallel import run_progress

    with run_progress(label, total=len(runs), enabled=progress is not None) as advance:
        return rows(runs, extractor, progress=advance, **kwargs)


def fit_risk_model(
    train_runs: Sequence[RunRecord],
    val_runs: Sequence[RunRecord],
    config: TrainConfig | None = None,
    *,
    rows: RowBuilder = build_training_data,
    progress: Callable[[str], None] | None = None,
    **settings: Any,
) -> tuple[RiskModel, CollapsePredictor]:
    """Steps 2-4: features, fit with early stopping, calibration. No thresholds yet.

    ``config`` (``settings`` over it): window, horizon, stride, signals, calibration, seed,
    params; ``hold_steps``, the hold the levels will be set on (``hold``).
    ``rows`` builds the feature rows of a list of runs (module docstring, fleet scale).
    ``progress``: lines of text, and a bar while the rows are built (module docstring).
    """
    config = TrainConfig.of(config, **settings)
    extractor = FeatureExtractor(
        window=config.window, signals=config.signals, extra_context=config.extra_context
    )
    common = {"stride": config.stride, "horizon": config.horizon}
    train = _rows(rows, train_runs, extractor, "features: train runs", progress, **common)
    val = _rows(rows, val_runs, extractor, "features: validation runs", progress, **common)
    train = near_positives(train, train_runs, config.positives_within)
    val = near_positives(val, val_runs, config.positives_within)
    _log(progress, f"fitting LightGBM on {len(train)} rows (early stopping on {len(val)})")
    predictor = CollapsePredictor(
        horizon=config.horizon, random_state=config.seed, **dict(config.params)
    )
    weights = healthy_rise_weights(train, config.healthy_rise_weight)
    predictor.fit(train.X, train.y, weights, eval_set=(val.X, val.y))
    calibrator = Calibrator(config.calibration).fit(predictor.raw_proba(val.X), val.y)
    model = RiskModel(
        predictor.booster_,
        extractor.schema,
        calibrator,
        thresholds={},
        horizon=config.horizon,
        hold_steps=config.hold_steps,
        meta={
            "seed": config.seed,
            "stride": config.stride,
            "train_config": config.to_dict(),
            "train_rows": len(train),
            "train_positive_rows": int(train.y.sum()),
            "best_iteration": predictor.best_iteration_,
            "params": predictor.get_params(),
        },
    )
    return model, predictor


def set_levels(
    model: RiskModel,
    runs: Sequence[RunRecord],
    budgets: Mapping[str, float] = DEFAULT_BUDGETS,
    scores: Mapping[str, np.ndarray] | None = None,
    by: str | None = None,
) -> RiskModel:
    """Step 5: thresholds from budgets on the healthy steps of runs scored at every step.

    Healthy steps are those the evaluation counts false alarms on
    (``evaluate.healthy_sequences``): all of a healthy run, and a collapsing run's
    steps before onset - horizon. Counted alike, the budget set is the budget measured:
    with healthy runs alone, the early alarms of collapsing runs (a slow ramp's start,
    300 steps before its onset) went uncounted, and more false alarms got through.
    ``scores``: run id -> per-row scores to use instead of the model's own (the
    cross-fitted scores of ``fit_and_level``); the other runs are scored by ``model``.

    Each source (real, synthetic, imported, ...) must hold the budget on its own, so each
    level is the highest of the per-source thresholds: pooled, the many synthetic healthy
    steps set a threshold that real runs crossed 10x as often as the budget (issue 8;
    benchmarks/README.md, "Predictor: honest evaluation").
    ``by`` (a set-up grouping, e.g. ``family``): within a source, each of its groups
    holds the budget on its own too, as the cross-fitted levels do: a new set-up looks
    like the least familiar known one, not their average (leave-one-family-out: about
    half the false alarms of the families pooled; benchmarks/README.md).
    """
    scores, scorer = scores or {}, ModelScorer(model)
    # recorded rows only, as evaluation scores them (a row gap is not healthy steps)
    by_group: dict[tuple[str, str], list[np.ndarray]] = {}
    for run in runs:
        frame = run.frame  # read once: a stored run is read from its file
        run_scores = scores.get(run.run_id)
        if run_scores is None:
            run_scores = scorer.score_run(frame)
        steps = frame["step"].to_numpy()
        scored = ScoredRun(run.run_id, run.meta.source, steps, run_scores, run.meta.onset_step)
        (healthy,) = healthy_sequences([scored], model.horizon)
        group = "" if by is None else held_out_group(run.meta, by)
        by_group.setdefault((run.meta.source, group), []).append(healthy)
    # a group whose validation runs all collapsed within a horizon of their start (a
    # fleet's rescued guarded runs) has no healthy step to hold a budget on: the others set
    # the levels; with none at all, thresholds_from_budgets says what is missing
    usable = [s for s in by_group.values() if sum(x.size for x in s)] or list(by_group.values())
    per_group = [thresholds_from_budgets(s, budgets) for s in usable]
    model.with_thresholds({level: max(t[level] for t in per_group) for level in LEVELS})
    model.budgets = dict(budgets)
    model.meta["threshold_sources"] = sorted({source for source, _ in by_group})
    # how many healthy steps back the thresholds: the tightest budget it can honour
    model.meta["threshold_healthy_steps"] = int(sum(x.size for v in by_group.values() for x in v))
    return model


def fit_and_level(
    train_runs: Sequence[RunRecord],
    val_runs: Sequence[RunRecord],
    config: TrainConfig | None = None,
    *,
    rows: RowBuilder = build_training_data,
    progress: Callable[[str], None] | None = None,
    **settings: Any,
) -> RiskModel:
    """Steps 2-5: :func:`fit_risk_model`, then the levels (module docstring, step 5).

    ``config.levels_by``: the set-up grouping whose groups are cross-fitted for the levels
    (``crossfit``); ``None`` sets them on the validation runs alone; ``config.budgets``:
    healthy steps between false alarms per level.
    ``meta["levels_from"]`` records which, and why when cross-fitting fell back.
    """
    config = TrainConfig.of(config, **settings)
    levels_by = config.levels_by

    model = fit_risk_model(train_runs, val_runs, config, rows=rows, progress=progress)[0]
    # the folds share their runs: each run's rows are built once for all of them (only
    # while cross-fitting, so a training without folds holds its rows once)
    fold_rows = RowCache(rows)

    def fit(train: Sequence[RunRecord], val: Sequence[RunRecord]) -> RiskModel:
        return fit_risk_model(train, val, config, rows=fold_rows, progress=progress)[0]

    cross = (
        None if levels_by is None else cross_fitted_scores(train_runs, val_runs, fit, by=levels_by)
    )
    if cross is not None and cross.fitted:
        set_levels(model, cross.runs, config.budgets, cross.scores, by=levels_by)
        model.meta["levels_from"] = {
            "runs": "cross-fitted",
            "by": levels_by,
            "groups": cross.groups,
        }
    else:
        set_levels(model, val_runs, config.budgets)
        why = {} if cross is None else {"not_cross_fitted": cross.reason}
        model.meta["levels_from"] = {"runs": "validation", **why}
    return model


def train_risk_model(
    run_paths: Iterable[str | Path],
    config: TrainConfig | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    rows: RowBuilder = build_training_data,
    **settings: Any,
) -> TrainingResult:
    """Train, calibrate, set levels and evaluate on run files (module docstring).

    Args:
        run_paths: run files (``*.parquet``); use ``runfiles.list_runs`` on folders.
        config: every setting of the training (:class:`TrainConfig`: seed, window,
            horizon, stride, hold_steps, budgets, fractions, calibration,
            eval_budget_per_10k, params, signals, levels_by); the same runs and seed give
            the same model string.
        progress: called with a line of text after each stage (e.g. ``print``).
        rows: builds the training rows of a list of runs; ``build_training_data`` here,
            ``predictor.training.fleet.rows_on(client)`` to compute them on a Dask cluster.
        settings: fields of :class:`TrainConfig` over ``config`` (``seed=3``).

    Raises:
        UserInputError: too few runs for a split to hold what it needs (a collapsed run
            to fit and calibrate on, a healthy one to set the levels on, a test run),
            before any fit (``training.data.require_trainable_split``).
    """
    config = TrainConfig.of(config, **settings)
    t0 = time.perf_counter()
    # sorted by id: row order feeds LightGBM's bagging, and must not depend on file order;
    # stored, not held: the train and validation runs are read from their files when used
    # (twice or so each), and only the test runs, scored by every scorer, are held
    runs = sorted(load_runs(run_paths, lazy=True), key=lambda r: r.run_id)
    metas = [r.meta for r in runs]
    split = split_runs(metas, seed=config.seed, fractions=config.fractions)
    require_trainable_split(metas, split)  # before any fit: what each split lacks
    by_split = _by_split(runs, split)
    by_split["test"] = [r.held for r in by_split["test"]]
    _log(progress, "split: " + ", ".join(f"{k} {len(v)} runs" for k, v in by_split.items()))
    stride = row_stride(by_split["train"], config.stride, config.horizon)
    if stride != config.stride:
        _log(
            progress,
            f"row stride {stride} instead of {config.stride}: at most {MAX_TRAIN_ROWS} rows",
        )
    fitted = config.replace(stride=stride)
    model = fit_and_level(
        by_split["train"], by_split["validation"], fitted, rows=rows, progress=progress
    )
    _log(
        progress,
        f"fitted {model.meta['n_trees']} trees; levels {model.thresholds} from "
        f"{model.meta['levels_from']['runs']} runs ({time.perf_counter() - t0:.0f} s)",
    )
    # the learned baselines are tuned on the validation runs, as the model's levels are
    _log(progress, "fitting and tuning the baselines")
    baselines = default_baselines(
        by_split["train"],
        by_split["validation"],
        horizon=config.horizon,
        budget_per_10k=config.eval_budget_per_10k,
        seed=config.seed,
    )
    _log(progress, f"evaluating on {len(by_split['test'])} test runs, every step, beside them")
    report = evaluate_runs(
        by_split["test"],
        model,
        baselines,
        budget_per_10k=config.eval_budget_per_10k,
        horizon=config.horizon,
    )
    fingerprint = data_fingerprint(runs)
    model.meta.update(
        {
            "trained_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "data_fingerprint": fingerprint,
            "n_runs": {k: len(v) for k, v in by_split.items()},
            "split": split.to_dict(),
            # what evaluate refuses to grade the model on (predictor.core.seen_runs)
            "train_run_ids": stored_ids(split.train),
            "validation_run_ids": stored_ids(split.validation),
            "lightgbm_version": lgb.__version__,
            "train_seconds": round(time.perf_counter() - t0, 1),
            "test_recall_at_budget": _finite_or_none(
                report.result("model", operating_point="budget").events.recall
            ),
            # the headline: recall at the stored warn level on the test runs
            "test_recall_at_warn": _finite_or_none(report.result("model").events.recall),
        }
    )
    _log(
        progress,
        f"evaluated on {len(by_split['test'])} test runs ({time.perf_counter() - t0:.0f} s)",
    )
    return TrainingResult(
        model=model,
        config=fitted,
        report=report,
        runs=tuple(SplitRecord.of(r, role) for role, rs in by_split.items() for r in rs),
        fingerprint=fingerprint,
        test_runs=tuple(by_split["test"]),
    )


def _by_split(runs: Sequence[RunRecord], split: RunSplit) -> dict[str, list[RunRecord]]:
    return {name: [r for r in runs if split.of(r.run_id) == name] for name in split.to_dict()}


def _finite_or_none(value: float) -> float | None:
    return float(value) if value is not None and np.isfinite(value) else None
