"""MLflow tracking and registry: log a training, register it, promote the champion.

Store. SQLite under ``mlruns/`` in the current directory unless ``MLFLOW_TRACKING_URI``
says otherwise: MLflow 3.17 refuses the plain-folder store, and a SQLite store keeps the
registry and aliases (docs/stack.md, "MLflow 3.17"). Each experiment is created with an explicit
artifact location beside the database, because SQLite stores otherwise put artifacts
relative to whatever directory the process happened to start in. The store's URI and
client are ``predictor.core.store``'s (``store.tracking_uri``, ``store.use_store``), not
re-exported here: importing this module costs mlflow, matplotlib and the training code.
Loading a model by URI is ``RiskModel.load`` (through ``predictor.core.store``).

What one training leaves behind (one MLflow run):

==========================  ===========================================================
params                      training settings and LightGBM hyperparameters
metrics                     test-split metrics, per source and per baseline; the
                            promotion figures (``compare.challenger.*``,
                            ``compare.champion.*``)
tags                        dataset fingerprint, feature schema version and fingerprint,
                            the promotion verdict and its reason
artifacts ``plots/``        PR curve, reliability, lead times, importance, baseline table
artifacts ``risk_model/``   the model folder as ``RiskModel.save`` writes it (its
                            ``risk_model.json`` holds the feature schema): what a
                            ``runs:/<run id>/risk_model`` URI loads
artifact ``promotion.json`` the decision, both models' figures and the comparison run ids
model ``pyfunc``            the same folder served by ``pyfunc_model.py``, logged as a
                            model from code (no pickle), with a signature (a run frame
                            in, risk by step out); registered as ``collapse-predictor``
==========================  ===========================================================

Promotion. Every training is registered as a new version; the alias ``champion`` moves to
it only by the rule of ``predictor.lifecycle.promotion``: both models scored on the same given runs
(those neither trained or validated on), each at its own stored ``warn`` level; promoted
on a strictly higher recall (or equal recall, fewer false alarms) while within its
false-alarm budget; a challenger calibrated on a user's set-up is judged on that set-up's
held-out runs, other set-ups' runs judging its ranking only. Every message names both
models by their registered version. The comparison is logged whether or not the alias moves.
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.models import ModelSignature
from mlflow.types import ColSpec, Schema

from collapse_guard.predictor.core import store
from collapse_guard.predictor.core.risk import MODEL_NAME, ModelFormatError, RiskModel
from collapse_guard.predictor.evaluate.events import ScoredRun
from collapse_guard.predictor.evaluate.plots import report_artifacts
from collapse_guard.predictor.lifecycle import promotion
from collapse_guard.predictor.lifecycle.promotion import Decision
from collapse_guard.predictor.training.train import TrainingResult
from collapse_guard.runfiles.records import RunRecord
from collapse_guard.signals import SIGNAL_NAMES

__all__ = [
    "CHAMPION",
    "DEFAULT_EXPERIMENT",
    "MODEL_NAME",
    "PYFUNC_CODE",
    "TrainingRecord",
    "champion_version",
    "ensure_experiment",
    "log_calibration",
    "log_result",
    "log_training",
    "training_params",
]

CHAMPION = "champion"
DEFAULT_EXPERIMENT = "collapse-guard"
# The models-from-code file MLflow runs to load the pyfunc model (nothing pickled).
PYFUNC_CODE = Path(__file__).resolve().with_name("pyfunc_model.py")
# What the pyfunc model needs at load time. Given explicitly: inferring it costs ~4 s.
_PIP_REQUIREMENTS = ["collapse-guard", "lightgbm>=4.3", "pandas>=2.2", "numpy>=1.26"]


def _artifact_location(uri: str, experiment: str) -> str | None:
    # A SQLite store keeps artifacts beside its database; a server store decides itself.
    if not uri.startswith("sqlite:///"):
        return None
    database = Path(uri.removeprefix("sqlite:///"))
    return (database.parent / "artifacts" / experiment).resolve().as_uri()


def ensure_experiment(name: str = DEFAULT_EXPERIMENT) -> str:
    """Id of the experiment ``name``, created with an explicit artifact location if new."""
    client = store.use_store()
    existing = client.get_experiment_by_name(name)
    if existing is not None:
        return existing.experiment_id
    return client.create_experiment(
        name, artifact_location=_artifact_location(store.tracking_uri(), name)
    )


def champion_version(model_name: str = MODEL_NAME) -> str | None:
    """The version the ``champion`` alias points at, or None when there is none yet."""
    client = store.use_store()
    try:
        return str(client.get_model_version_by_alias(model_name, CHAMPION).version)
    except MlflowException:
        # Raised both when the registered model does not exist and when it has no alias.
        return None


def _signature() -> ModelSignature:
    # Every signal is optional: imported logs carry only loss and grad norm, and the
    # feature transform gives NaN features for what is missing.
    inputs = Schema(
        [ColSpec("long", "step"), *(ColSpec("double", s, required=False) for s in SIGNAL_NAMES)]
    )
    outputs = Schema(
        [ColSpec("long", "step"), ColSpec("double", "p_collapse"), ColSpec("string", "level")]
    )
    return ModelSignature(inputs=inputs, outputs=outputs)


# What a request looks like: a few steps of a run with only the signals logs always have.
# MLflow stores it with the model and checks the signature against it when logging.
_INPUT_EXAMPLE = pd.DataFrame(
    {"step": [0, 1, 2], "loss": [2.51, 2.48, 2.50], "grad_norm": [0.91, 0.87, 0.95]}
)


@dataclass(frozen=True)
class TrainingRecord:
    """What :func:`log_training` did: the MLflow run, the version and the promotion decision."""

    run_id: str
    experiment_id: str
    version: str | None  # None when not registered
    previous_champion: str | None
    decision: Decision | None  # None when not registered

    @property
    def promoted(self) -> bool:
        return self.decision is not None and self.decision.promoted

    @property
    def reason(self) -> str:
        return "" if self.decision is None else self.decision.reason


def _clean_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    # A metric that could not be computed (no collapse in a source) is NaN; MLflow stores
    # NaN but sorts and compares it badly in the UI, so only finite numbers are logged.
    out = {}
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out


def _log_model(model: RiskModel, folder: Path, registered_name: str | None):
    model.save(folder)
    mlflow.log_artifacts(str(folder), store.FOLDER_ARTIFACT)  # runs:/<id>/risk_model
    return mlflow.pyfunc.log_model(
        name="pyfunc",
        python_model=str(PYFUNC_CODE),
        artifacts={store.FOLDER_ARTIFACT: str(folder)},
        signature=_signature(),
        input_example=_INPUT_EXAMPLE,
        pip_requirements=_PIP_REQUIREMENTS,
        registered_model_name=registered_name,
    )


def _decide(
    model: RiskModel,
    model_name: str,
    versions: tuple[str, str | None],
    comparison_runs: Sequence[RunRecord],
    scored: Mapping[str, ScoredRun] | None,
    ranking_runs: Sequence[RunRecord],
) -> Decision:
    """Promotion of ``versions[0]`` against the current champion ``versions[1]``
    (``predictor.lifecycle.promotion``), each named by its registered version."""
    previous = versions[1]
    if previous is None:
        return promotion.compare(model, None, comparison_runs, scored, names=versions)
    try:
        champion = RiskModel.load(f"models:/{model_name}@{CHAMPION}")
    except ModelFormatError as error:
        # A champion this code cannot run (older feature version or folder format)
        # serves no one: the new model replaces it.
        return Decision(True, f"champion v{previous} cannot be loaded: {error}")
    return promotion.compare(
        model, champion, comparison_runs, scored, ranking_runs=ranking_runs, names=versions
    )


def log_training(
    model: RiskModel,
    *,
    params: Mapping[str, Any],
    fingerprint: str,
    metrics: Mapping[str, float] | None = None,
    comparison_runs: Sequence[RunRecord] = (),
    ranking_runs: Sequence[RunRecord] = (),
    scored: Mapping[str, ScoredRun] | None = None,
    artifacts: str | Path | None = None,
    experiment: str = DEFAULT_EXPERIMENT,
    register: bool = True,
    model_name: str = MODEL_NAME,
    tags: Mapping[str, str] | None = None,
) -> TrainingRecord:
    """Log one training as an MLflow run, register it, promote it if the rule says so.

    Args:
        model: the trained model (``TrainingResult.model``).
        params: settings to log as MLflow params.
        fingerprint: the data fingerprint (``TrainingResult.fingerprint``).
        metrics: flat test-split metrics to log (``EvalReport.to_metrics()``).
        comparison_runs: ``RunRecord``s both the new model and the champion are scored
            on (``predictor.lifecycle.promotion.compare``; the runs either model saw are set apart).
            Without any, a champion is never replaced (only a first model is promoted).
        ranking_runs: runs of other set-ups that judge ranking only (``promotion``, rule 5),
            beside ``comparison_runs`` of the set-up the model was calibrated on.
        scored: the model's risk on runs already scored (``EvalReport.model_runs``): not
            scored again for promotion.
        artifacts: a folder (plots, tables) logged under ``plots/``.
        register: register as a new version of ``model_name`` and decide promotion.
    """
    store.use_store()
    experiment_id = ensure_experiment(experiment)
    with (
        tempfile.TemporaryDirectory(prefix="collapse-guard-log-") as tmp,
        mlflow.start_run(experiment_id=experiment_id) as run,
    ):
        mlflow.log_params({k: str(v)[:500] for k, v in params.items()})
        mlflow.set_tags(
            {
                "dataset_fingerprint": fingerprint,
                "feature_schema_version": str(model.schema.version),
                "feature_schema_fingerprint": str(model.schema.fingerprint),
                "horizon": str(model.horizon),
                **(tags or {}),
            }
        )
        mlflow.log_metrics(_clean_metrics(metrics or {}))
        if artifacts is not None:
            mlflow.log_artifacts(str(artifacts), "plots")
        previous = champion_version(model_name) if register else None
        info = _log_model(
            model, Path(tmp) / store.FOLDER_ARTIFACT, model_name if register else None
        )
        if not register:
            return TrainingRecord(run.info.run_id, experiment_id, None, None, None)
        version = str(info.registered_model_version)
        decision = _decide(
            model, model_name, (version, previous), comparison_runs, scored, ranking_runs
        )
        _log_decision(decision, previous)
        if decision.promoted:
            store.use_store().set_registered_model_alias(model_name, CHAMPION, version)
        return TrainingRecord(run.info.run_id, experiment_id, version, previous, decision)


def _log_decision(decision: Decision, previous: str | None) -> None:
    mlflow.log_metrics(_clean_metrics(decision.to_metrics()))
    mlflow.set_tags(
        {
            "promotion": "promoted" if decision.promoted else "kept",
            "promotion_reason": decision.reason[:5000],
            "previous_champion": previous or "",
        }
    )
    record = {
        "promoted": decision.promoted,
        "reason": decision.reason,
        "previous_champion": previous,
        "comparison_run_ids": list(decision.run_ids),
        **{k: v for k, v in decision.to_metrics().items() if math.isfinite(v)},
    }
    mlflow.log_text(json.dumps(record, indent=2, sort_keys=True), "promotion.json")


def training_params(result: TrainingResult) -> dict[str, Any]:
    """The MLflow params of a training: settings, split sizes, budgets, levels, LightGBM."""
    model = result.model
    settings = result.config.to_dict()
    # the budgets and hyperparameters are logged below as the model holds them (a
    # calibrated model's levels, LightGBM's resolved params); the signals are its schema's
    for name in ("budgets", "params", "signals"):
        settings.pop(name)
    return {
        **settings,
        "n_signals": len(model.schema.signals),
        "n_runs": len(result.runs),
        **{f"split.{k}": v for k, v in result.counts().items()},
        **{f"budget.{k}": v for k, v in model.budgets.items()},
        **{f"threshold.{k}": v for k, v in model.thresholds.items()},
        **{f"lgbm.{k}": v for k, v in model.meta.get("params", {}).items()},
    }


def log_result(
    result: TrainingResult,
    *,
    comparison_runs: Sequence[RunRecord] | None = None,
    ranking_runs: Sequence[RunRecord] = (),
    params: Mapping[str, Any] | None = None,
    experiment: str = DEFAULT_EXPERIMENT,
    register: bool = True,
    model_name: str = MODEL_NAME,
    tags: Mapping[str, str] | None = None,
) -> TrainingRecord:
    """:func:`log_training` of a :class:`TrainingResult`: its metrics, fingerprint, plots.

    ``comparison_runs``: what promotion scores both models on; default the result's test
    runs (of which the champion's own training and validation runs are set apart).
    ``ranking_runs``: judged for ranking only (:func:`log_training`). ``params``: more
    params, beside :func:`training_params`.
    """
    runs = result.test_runs if comparison_runs is None else comparison_runs
    with tempfile.TemporaryDirectory(prefix="collapse-guard-plots-") as plots:
        report_artifacts(result.model, result.report, plots)
        return log_training(
            result.model,
            params={**training_params(result), **(params or {})},
            fingerprint=result.fingerprint,
            metrics=result.report.to_metrics(),
            comparison_runs=runs,
            ranking_runs=ranking_runs,
            scored=result.report.model_runs,
            artifacts=plots,
            experiment=experiment,
            register=register,
            model_name=model_name,
            tags=tags,
        )


def log_calibration(
    model: RiskModel,
    *,
    experiment: str = DEFAULT_EXPERIMENT,
    model_name: str = MODEL_NAME,
    alias: str | None = None,
) -> TrainingRecord:
    """Register a model from ``recalibrate.calibrate`` as a version of ``model_name``.

    The MLflow run and the version name what it was calibrated from: the base version, the
    calibration runs (tag ``calibrated_on``: their count and a digest; artifact
    ``calibrated_on.json``: the ids) and each level's evidence. Its levels were set on runs
    no benchmark holds, so the promotion rule has nothing to compare it on: the champion
    alias moves only to a first model; ``alias`` (e.g. ``setup-llama``) points a name at it.
    """
    ids = list(model.meta["calibrated_on"])
    digest = hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]
    evidence = model.meta["levels_evidence"]
    named = {
        "calibrated_on": f"{len(ids)} runs, sha256 {digest}",
        "base_model_version": str(model.meta["base_version"]),
    }
    record = log_training(
        model,
        params={
            "base_version": model.meta["base_version"],
            "calibration_runs": len(ids),
            "confidence": model.meta["levels_from"]["confidence"],
            **{f"threshold.{k}": v for k, v in model.thresholds.items()},
            **{f"certified.{k}": e["certified"] for k, e in evidence.items()},
        },
        fingerprint=digest,
        metrics={"healthy_steps": float(model.meta["threshold_healthy_steps"])},
        experiment=experiment,
        model_name=model_name,
        tags=named,
    )
    client = store.use_store()
    client.log_text(
        record.run_id,
        json.dumps({"calibrated_on": ids, "levels_evidence": evidence}, indent=2),
        "calibrated_on.json",
    )
    for key, value in named.items():
        client.set_model_version_tag(model_name, record.version, key, value)
    if alias:
        client.set_registered_model_alias(model_name, alias, record.version)
    return record
