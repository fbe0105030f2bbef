"""The MLflow tracking store, as far as loading a model needs it (no RiskModel here).

``RiskModel.load("models:/collapse-predictor@champion")`` comes through
:func:`fetched_model_folder`; ``predictor.lifecycle.registry`` (logging, registering, promotion)
builds on the same store functions. Keeping them apart from the registry is what lets
``risk`` import this module and the registry import ``risk``, with no import circle.

Reads never make a store: :func:`tracking_uri` and :func:`use_store` take
``create=False`` for them (a missing SQLite store is then a ``UserInputError``); writers
(train, retrain) keep the default, which makes the default store on first use.

mlflow is imported inside the functions: it costs ~1 s, and the service, the guard
and ``collapse-guard --help`` import ``risk`` without ever touching a store.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from collapse_guard.errors import UserInputError

__all__ = [
    "DEFAULT_STORE",
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


# The store when MLFLOW_TRACKING_URI is unset, relative to the current directory.
DEFAULT_STORE = Path("mlruns") / "mlflow.db"
_SQLITE = "sqlite:///"


def tracking_uri(*, create: bool = True) -> str:
    """``MLFLOW_TRACKING_URI`` if set, else SQLite at ``<cwd>/mlruns/mlflow.db``.

    ``create=True`` (writers: train, retrain): the default store's folder is made, and
    MLflow makes the database on first use. ``create=False`` (reads: loading a model,
    the service's registry polls): nothing is made, and a SQLite store that does not
    exist is a :class:`UserInputError` naming it: MLflow would otherwise make an empty
    database, and the user would read "model not found" about a store they never meant.
    Server stores (http://, postgresql://, ...) are left to MLflow: only it can reach them.
    """
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri is None:
        database = Path.cwd() / DEFAULT_STORE
        named = f"the default store ./{DEFAULT_STORE}"
        if create:
            database.parent.mkdir(parents=True, exist_ok=True)
        uri = f"{_SQLITE}{database}"
    elif uri.startswith(_SQLITE):
        database, named = Path(uri.removeprefix(_SQLITE)), f"MLFLOW_TRACKING_URI={uri}"
    else:
        return uri
    if not create and not database.is_file():
        raise UserInputError(
            f"no MLflow tracking store: {named} does not exist ({database})",
            "point at your store with MLFLOW_TRACKING_URI (or --tracking-uri where the command "
            "takes it), run from the folder that holds mlruns/, or train and register a model "
            "first (`collapse-guard train --runs DIR`)",
        )
    return uri


def use_store(*, create: bool = True):
    """Point mlflow at :func:`tracking_uri` (``create`` as there) and return a client.

    The URI is read at every call rather than once at import: tests and long-lived
    processes switch stores through the environment.
    """
    import mlflow

    uri = tracking_uri(create=create)
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
    client = use_store(create=False)
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
    ``models:/m-<id>`` or ``runs:/<run id>/risk_model``. A SQLite tracking store that
    does not exist is a :class:`UserInputError` (:func:`tracking_uri`), and none is made.
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    use_store(create=False)  # a read: a missing store is an error, never a new one
    with tempfile.TemporaryDirectory(prefix="collapse-guard-model-") as tmp:
        try:
            pinned, stamp = _pinned(uri)
            local = Path(mlflow.artifacts.download_artifacts(artifact_uri=pinned, dst_path=tmp))
        except MlflowException as error:
            raise ValueError(
                f"cannot load model {uri!r} from the tracking store "
                f"{tracking_uri(create=False)}: "
                f"{error.message}; expected a registered model "
                "(models:/collapse-predictor@champion) or a run artifact; train one with "
                "`collapse-guard train --runs DIR`, or set MLFLOW_TRACKING_URI"
            ) from None
        yield _folder_in(local, uri), stamp
