"""The MLflow tracking store, as far as loading a model needs it (no RiskModel here).

``RiskModel.load("models:/collapse-predictor@champion")`` comes through
:func:`fetched_model_folder`; ``predictor.registry`` (logging, registering, promotion)
builds on the same store functions. Keeping them apart from the registry is what lets
``risk`` import this module and the registry import ``risk``, with no import circle.

mlflow is imported inside the functions: it costs ~1 s, and the service, the guard
and ``collapse-guard --help`` import ``risk`` without ever touching a store.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "FOLDER_ARTIFACT",
    "REGISTRY_SCHEMES",
    "fetched_model_folder",
    "is_registry_uri",
    "tracking_uri",
    "use_store",
]

# Name of the model folder inside a run's artifacts and inside the pyfunc model.
FOLDER_ARTIFACT = "risk_model"
REGISTRY_SCHEMES = ("models:/", "runs:/")


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set, else SQLite at ``<cwd>/mlruns/mlflow.db`` (made on use)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    folder = Path.cwd() / "mlruns"
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'mlflow.db'}"


def use_store():
    """Point mlflow at :func:`tracking_uri` and return a client for it.

    The URI is read at every call rather than once at import: tests and long-lived
    processes switch stores through the environment.
    """
    import mlflow

    uri = tracking_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)


def is_registry_uri(source: object) -> bool:
    """True for ``models:/...`` and ``runs:/...`` strings (loaded through the store)."""
    return isinstance(source, str) and source.startswith(REGISTRY_SCHEMES)


def _pinned(uri: str) -> tuple[str, dict[str, str]]:
    """A ``models:/name@alias`` or ``models:/name/N`` URI pinned to its version number, and
    what to stamp into the loaded model's meta (name, version, run id); others unchanged.

    Resolving the alias once, before the download, means a promotion that moves the alias
    meanwhile cannot hand back one version's files under another's number.
    """
    if not uri.startswith("models:/"):
        return uri, {}
    name, _, alias = uri.removeprefix("models:/").partition("@")
    client = use_store()
    if alias:
        version = client.get_model_version_by_alias(name, alias)
    elif "/" in name:
        name, number = name.split("/", 1)
        version = client.get_model_version(name, number)
    else:
        return uri, {}  # a LoggedModel id (models:/m-...): not a registry version
    stamp = {"name": name, "version": str(version.version), "run_id": version.run_id}
    return f"models:/{name}/{version.version}", stamp


def _folder_in(local: Path, uri: str) -> Path:
    # A pyfunc model keeps the folder among its artifacts (MLmodel says where); a run
    # artifact path (runs:/<id>/risk_model) is the folder itself.
    from mlflow.models import Model

    if not (local / "MLmodel").exists():
        return local
    flavor = Model.load(str(local)).flavors.get("python_function", {})
    try:
        return local / flavor["artifacts"][FOLDER_ARTIFACT]["path"]
    except KeyError:
        raise ValueError(
            f"model {uri!r} is not a collapse-guard risk model: expected a pyfunc artifact "
            f"{FOLDER_ARTIFACT!r}, got artifacts {sorted(flavor.get('artifacts', {}))}; "
            "register models with `collapse-guard train`"
        ) from None


@contextmanager
def fetched_model_folder(uri: str) -> Iterator[tuple[Path, dict[str, str]]]:
    """Download the model folder behind an MLflow URI into a temporary folder.

    Yields ``(folder, stamp)``: a folder ``RiskModel.load_folder`` reads, and the registry
    name, version and run id to write into the model's meta ({} when the URI names no
    registry version). The folder is deleted on exit: load what you need inside.

    ``uri``: ``models:/collapse-predictor@champion``, ``models:/collapse-predictor/3``,
    ``models:/m-<id>`` or ``runs:/<run id>/risk_model``.
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    use_store()
    with tempfile.TemporaryDirectory(prefix="collapse-guard-model-") as tmp:
        try:
            pinned, stamp = _pinned(uri)
            local = Path(mlflow.artifacts.download_artifacts(artifact_uri=pinned, dst_path=tmp))
        except MlflowException as error:
            raise ValueError(
                f"cannot load model {uri!r} from the tracking store {tracking_uri()}: "
                f"{error.message}; expected a registered model "
                "(models:/collapse-predictor@champion) or a run artifact; train one with "
                "`collapse-guard train --runs DIR`, or set MLFLOW_TRACKING_URI"
            ) from None
        yield _folder_in(local, uri), stamp
