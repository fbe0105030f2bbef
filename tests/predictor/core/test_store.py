"""The tracking store: writers make the default store, reads never make one."""

from __future__ import annotations

import pytest

from collapse_guard.errors import UserInputError
from collapse_guard.predictor.core import store
from collapse_guard.predictor.core.risk import RiskModel


@pytest.fixture
def no_store(tmp_path, monkeypatch):
    """An empty current folder, MLFLOW_TRACKING_URI unset."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_writer_gets_sqlite_under_cwd_and_its_folder(no_store, monkeypatch):
    assert store.tracking_uri() == f"sqlite:///{no_store}/mlruns/mlflow.db"
    assert (no_store / "mlruns").is_dir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://example:5000")
    assert store.tracking_uri() == store.tracking_uri(create=False) == "http://example:5000"


def test_a_read_of_a_missing_store_names_it_and_makes_nothing(no_store, monkeypatch):
    with pytest.raises(UserInputError) as caught:
        store.tracking_uri(create=False)
    message = str(caught.value)
    assert "./mlruns/mlflow.db does not exist" in message
    assert str(no_store / "mlruns" / "mlflow.db") in message
    assert "MLFLOW_TRACKING_URI (or --tracking-uri" in message
    database = no_store / "elsewhere" / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{database}")
    with pytest.raises(UserInputError, match=f"MLFLOW_TRACKING_URI=sqlite:///{database}"):
        store.use_store(create=False)
    assert list(no_store.iterdir()) == []


def test_a_read_of_an_existing_store_returns_its_uri(no_store):
    (no_store / "mlruns").mkdir()
    (no_store / "mlruns" / "mlflow.db").touch()
    assert store.tracking_uri(create=False) == f"sqlite:///{no_store}/mlruns/mlflow.db"


@pytest.mark.parametrize(
    "uri", ["models:/collapse-predictor@champion", "models:/collapse-predictor/1", "runs:/0a1/m"]
)
def test_loading_a_registry_model_from_python_makes_no_store(no_store, uri):
    """RiskModel.load is a read: no ./mlruns appears, however the model is named."""
    with pytest.raises(UserInputError, match="no MLflow tracking store"):
        RiskModel.load(uri)
    assert list(no_store.iterdir()) == []
