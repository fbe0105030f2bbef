"""Set-up of the integration tests: no ``datasets`` package made of the tests' own folder;
under CI, both frameworks and tensorboard required (their tests skip where an extra is
missing); one SQLite MLflow store for the trackers' tests.

The root conftest puts ``tests/`` on ``sys.path`` (test folders are not packages), so with
Hugging Face's ``datasets`` not installed, ``import datasets`` finds ``tests/datasets`` as
a namespace package; transformers then takes it for the real one and the Trainer fails on
``datasets.Dataset``. Marking the name as absent before transformers is first imported
makes transformers see what is true: no ``datasets`` installed.
"""

import importlib.util
import os
import sys

import pytest

_spec = importlib.util.find_spec("datasets")
if _spec is not None and _spec.origin is None:  # a namespace package: a folder, no code
    sys.modules["datasets"] = None

if os.environ.get("CI"):  # CI installs both extras (make install): there, a missing one
    # must fail the run, not skip its tests quietly
    import accelerate  # noqa: F401
    import lightning.pytorch  # noqa: F401
    import tensorboard  # noqa: F401  (the dev extra)
    import transformers  # noqa: F401


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory):
    """URI of a SQLite MLflow store of the session's (schema migrated once: 5-25 s here);
    each test creates an experiment of its own in it."""
    mlflow = pytest.importorskip("mlflow")
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    mlflow.MlflowClient(tracking_uri=uri).search_experiments()
    return uri


@pytest.fixture
def active_store(mlflow_uri, monkeypatch):
    """The session's store as this test's tracking URI: the environment variable and
    mlflow's own global, which an earlier test's ``mlflow.set_tracking_uri`` may have set
    (it wins over the variable: the run would go to that test's store)."""
    import mlflow

    before = mlflow.get_tracking_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    mlflow.set_tracking_uri(mlflow_uri)
    yield mlflow_uri
    mlflow.set_tracking_uri(before)
