"""MLflow tracking and registry: log a training, register it, promote the champion, load by URI.

Store. SQLite under ``mlruns/`` in the current directory unless ``MLFLOW_TRACKING_URI``
says otherwise: MLflow 3.17 refuses the plain-folder store, and a SQLite store keeps the
registry and aliases (../shared/STACK.md). Each experiment is created with an explicit
artifact location beside the database, because SQLite stores otherwise put artifacts
relative to whatever directory the process happened to start in.

What one training leaves behind (one MLflow run):

==========================  ===========================================================
params                      training settings and LightGBM hyperparameters
metrics                     test-split metrics, per source and per baseline
tags                        dataset fingerprint, feature schema version and fingerprint
artifacts ``plots/``        PR curve, reliability, lead times, importance, baseline table
artifacts ``risk_model/``   the model folder as ``RiskModel.save`` writes it
model ``pyfunc``            the same folder wrapped as an ``mlflow.pyfunc`` model with a
                            signature (a run frame in, risk by step out); registered as
                            ``collapse-predictor``
==========================  ===========================================================

Promotion. Every training is registered as a new version; the alias ``champion`` moves to
it only when it beats the current champion on the same evaluation: both models are scored
by one function on the new training's test runs. Primary metric: recall at the ``warn``
false-alarm budget; tie-break: PR-AUC. The comparison is logged as metrics and tags
whether or not the alias moves.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.models import Model, ModelSignature
from mlflow.types import ColSpec, Schema

from collapse_guard.datasets.runfile import read_meta
from collapse_guard.signals import SIGNAL_NAMES

if TYPE_CHECKING:
    from collapse_guard.predictor.risk import RiskModel

__all__ = [
    "CHAMPION",
    "DEFAULT_EXPERIMENT",
    "MODEL_NAME",
    "PRIMARY_METRIC",
    "TIE_BREAK_METRIC",
    "RiskPyfunc",
    "TrainingRecord",
    "beats",
    "champion_version",
    "dataset_fingerprint",
    "ensure_experiment",
    "load_model_folder",
    "log_training",
    "tracking_uri",
]

MODEL_NAME = "collapse-predictor"
CHAMPION = "champion"
DEFAULT_EXPERIMENT = "collapse-guard"
PRIMARY_METRIC = "recall_at_warn"
TIE_BREAK_METRIC = "pr_auc"
# Name of the model folder inside a run's artifacts and inside the pyfunc model.
FOLDER_ARTIFACT = "risk_model"
# What the pyfunc model needs at load time. Given explicitly: inferring it costs ~4 s.
_PIP_REQUIREMENTS = ["collapse-guard", "lightgbm>=4.3", "pandas>=2.2", "numpy>=1.26"]


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set, else SQLite at ``<cwd>/mlruns/mlflow.db`` (made on use)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    folder = Path.cwd() / "mlruns"
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'mlflow.db'}"


def _use_store() -> mlflow.MlflowClient:
    # Read the URI at every call rather than once at import: tests and long-lived
    # processes switch stores through the environment.
    uri = tracking_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)


def _artifact_location(uri: str, experiment: str) -> str | None:
    # A SQLite store keeps artifacts beside its database; a server store decides itself.
    if not uri.startswith("sqlite:///"):
        return None
    database = Path(uri.removeprefix("sqlite:///"))
    return (database.parent / "artifacts" / experiment).resolve().as_uri()


def ensure_experiment(name: str = DEFAULT_EXPERIMENT) -> str:
    """Id of the experiment ``name``, created with an explicit artifact location if new."""
    client = _use_store()
    existing = client.get_experiment_by_name(name)
    if existing is not None:
        return existing.experiment_id
    return client.create_experiment(
        name, artifact_location=_artifact_location(tracking_uri(), name)
    )


def champion_version(model_name: str = MODEL_NAME) -> str | None:
    """The version the ``champion`` alias points at, or None when there is none yet."""
    client = _use_store()
    try:
        return str(client.get_model_version_by_alias(model_name, CHAMPION).version)
    except MlflowException:
        # Raised both when the registered model does not exist and when it has no alias.
        return None


def dataset_fingerprint(paths: Sequence[str | Path]) -> str:
    """Short hash of the runs' ids, label versions, onsets and sizes (order-independent).

    Two trainings with the same fingerprint saw the same labelled data; a relabelled or
    regrown run changes it. Reads only the files' footers.
    """
    import pyarrow.parquet as pq

    keys = []
    for path in paths:
        meta = read_meta(path)
        rows = pq.read_metadata(path).num_rows
        keys.append(f"{meta.run_id}|{meta.label_version}|{meta.onset_step}|{rows}")
    return hashlib.sha256("\n".join(sorted(keys)).encode()).hexdigest()[:16]


def _stamp_version(folder: Path, uri: str) -> None:
    # The folder was saved before the registry numbered it; write the version into the
    # local copy so that RiskModel.meta (and the service's answers) name what was loaded.
    if not uri.startswith("models:/"):
        return
    name, _, ref = uri.removeprefix("models:/").partition("@")
    client = _use_store()
    if ref:
        version = client.get_model_version_by_alias(name, ref)
    elif "/" in name:
        name, number = name.split("/", 1)
        version = client.get_model_version(name, number)
    else:
        return  # a LoggedModel id (models:/m-...): not a registry version
    spec_path = folder / "risk_model.json"
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    spec["meta"] |= {"name": name, "version": str(version.version), "run_id": version.run_id}
    spec_path.write_text(json.dumps(spec, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def load_model_folder(uri: str, dst: str | Path | None = None) -> Path:
    """Download the model folder behind an MLflow URI; returns a folder ``RiskModel`` loads.

    ``uri``: ``models:/collapse-predictor@champion``, ``models:/collapse-predictor/3``,
    ``models:/m-<id>`` or ``runs:/<run id>/risk_model``.
    """
    _use_store()
    dst = Path(dst) if dst is not None else Path(tempfile.mkdtemp(prefix="collapse-guard-model-"))
    try:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(dst)))
    except MlflowException as error:
        raise ValueError(
            f"cannot load model {uri!r} from the tracking store {tracking_uri()}: {error.message}; "
            "expected a registered model (models:/collapse-predictor@champion) or a run artifact; "
            "train one with `collapse-guard train --runs DIR`, or set MLFLOW_TRACKING_URI"
        ) from None
    if not (local / "MLmodel").exists():
        return local  # a run artifact path: the folder itself
    # A pyfunc model keeps the folder among its artifacts; MLmodel says where.
    flavor = Model.load(str(local)).flavors.get("python_function", {})
    try:
        folder = local / flavor["artifacts"][FOLDER_ARTIFACT]["path"]
    except KeyError:
        raise ValueError(
            f"model {uri!r} is not a collapse-guard risk model: expected a pyfunc artifact "
            f"{FOLDER_ARTIFACT!r}, got artifacts {sorted(flavor.get('artifacts', {}))}; "
            "register models with `collapse-guard train`"
        ) from None
    _stamp_version(folder, uri)
    return folder


class RiskPyfunc(mlflow.pyfunc.PythonModel):
    """``mlflow.pyfunc`` face of a risk model: one run frame in, risk and level by step out.

    Pickled by reference to this module, so loading needs collapse-guard installed (it is
    in the model's pip requirements).
    """

    def load_context(self, context) -> None:
        from collapse_guard.predictor.risk import RiskModel

        self.model = RiskModel.load(context.artifacts[FOLDER_ARTIFACT])

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        risk = self.model.predict_run(model_input)
        return pd.DataFrame(
            {
                "step": risk.index.to_numpy(dtype="int64"),
                "p_collapse": risk.to_numpy(dtype="float64"),
                "level": [self.model.level(p) for p in risk.to_numpy()],
            }
        )


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


def beats(new: Mapping[str, float], old: Mapping[str, float]) -> bool:
    """True when ``new`` is strictly better: higher primary metric, or equal and higher PR-AUC."""

    def key(scores: Mapping[str, float]) -> tuple[float, float]:
        # A metric that could not be computed (no collapses in the split) ranks lowest.
        return tuple(  # type: ignore[return-value]
            -math.inf if v is None or math.isnan(v) else float(v)
            for v in (scores.get(PRIMARY_METRIC), scores.get(TIE_BREAK_METRIC))
        )

    return key(new) > key(old)


@dataclass
class TrainingRecord:
    """What :func:`log_training` did: the MLflow run, the version and the promotion decision."""

    run_id: str
    experiment_id: str
    version: str | None  # None when not registered
    promoted: bool
    previous_champion: str | None
    new_scores: dict[str, float] = field(default_factory=dict)
    champion_scores: dict[str, float] = field(default_factory=dict)
    reason: str = ""


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


def log_training(
    model: RiskModel,
    *,
    metrics: Mapping[str, float],
    score: Callable[[RiskModel], Mapping[str, float]],
    params: Mapping[str, Any],
    fingerprint: str,
    artifacts: str | Path | None = None,
    experiment: str = DEFAULT_EXPERIMENT,
    register: bool = True,
    model_name: str = MODEL_NAME,
    tags: Mapping[str, str] | None = None,
) -> TrainingRecord:
    """Log one training as an MLflow run, register it and promote it if it beats the champion.

    ``metrics``: flat test-split metrics to log. ``score``: evaluates any risk model on the
    new test split and returns at least :data:`PRIMARY_METRIC` and :data:`TIE_BREAK_METRIC`;
    it is applied to the new model and to the champion so that both face the same runs.
    ``artifacts``: a folder (plots, tables) logged under ``plots/``.
    """
    from collapse_guard.predictor.risk import ModelFormatError, RiskModel

    client = _use_store()
    experiment_id = ensure_experiment(experiment)
    with (
        tempfile.TemporaryDirectory(prefix="collapse-guard-log-") as tmp,
        mlflow.start_run(experiment_id=experiment_id) as run,
    ):
        mlflow.log_params({k: str(v)[:500] for k, v in params.items()})
        schema = model.schema
        mlflow.set_tags(
            {
                "dataset_fingerprint": fingerprint,
                "feature_schema_version": str(schema.version),
                "feature_schema_fingerprint": str(schema.fingerprint),
                "horizon": str(model.horizon),
                **(tags or {}),
            }
        )
        mlflow.log_metrics(_clean_metrics(metrics))
        if artifacts is not None:
            mlflow.log_artifacts(str(artifacts), "plots")
        folder = Path(tmp) / FOLDER_ARTIFACT
        model.save(folder)
        mlflow.log_artifacts(str(folder), FOLDER_ARTIFACT)
        mlflow.log_dict(schema.to_dict(), "feature_schema.json")
        info = mlflow.pyfunc.log_model(
            name="pyfunc",
            python_model=RiskPyfunc(),
            artifacts={FOLDER_ARTIFACT: str(folder)},
            signature=_signature(),
            input_example=_INPUT_EXAMPLE,
            pip_requirements=_PIP_REQUIREMENTS,
            registered_model_name=model_name if register else None,
        )
        record = TrainingRecord(
            run_id=run.info.run_id,
            experiment_id=experiment_id,
            version=str(info.registered_model_version) if register else None,
            promoted=False,
            previous_champion=champion_version(model_name) if register else None,
        )
        if not register:
            return record
        record.new_scores = dict(score(model))
        if record.previous_champion is None:
            record.promoted, record.reason = True, "first registered model"
        else:
            try:
                champion = RiskModel.load(f"models:/{model_name}@{CHAMPION}")
            except ModelFormatError as error:
                # A champion this code cannot run (older feature version or folder
                # format) serves no one: the new model replaces it.
                champion = None
                record.promoted = True
                record.reason = f"champion v{record.previous_champion} cannot be loaded: {error}"
            if champion is not None:
                record.champion_scores = dict(score(champion))
                record.promoted = beats(record.new_scores, record.champion_scores)
                verdict = "beats" if record.promoted else "does not beat"
                record.reason = (
                    f"v{record.version} {verdict} champion v{record.previous_champion} on "
                    f"{PRIMARY_METRIC} then {TIE_BREAK_METRIC}"
                )
        comparison = {f"compare.new.{k}": v for k, v in record.new_scores.items()}
        comparison |= {f"compare.champion.{k}": v for k, v in record.champion_scores.items()}
        mlflow.log_metrics(_clean_metrics(comparison))
        mlflow.set_tags(
            {
                "promotion": "promoted" if record.promoted else "kept",
                "promotion_reason": record.reason,
                "previous_champion": record.previous_champion or "",
            }
        )
        if record.promoted:
            client.set_registered_model_alias(model_name, CHAMPION, record.version)
        return record
