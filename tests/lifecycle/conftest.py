"""Lifecycle fixtures: short synthetic runs, and a fresh real SQLite MLflow store per test.

A fresh SQLite store costs 5-15 s of schema migration on the shared machine; the session
migrates one empty store and each test gets a copy of its database file (a copy is a new,
independent store), with artifacts beside it.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # before lightgbm (STACK.md)
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

import shutil

import pytest
from lifecycle_settings import RUNS

from collapse_guard.datasets.synthetic.generate import generate_synthetic_runs


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory):
    """Path of a migrated, empty SQLite MLflow database (made once per session)."""
    import mlflow

    path = tmp_path_factory.mktemp("empty_store") / "mlflow.db"
    mlflow.MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def store(tmp_path, empty_store, monkeypatch):
    """A fresh store of this test's own (MLFLOW_TRACKING_URI points at it); its URI."""
    folder = tmp_path / "mlruns"
    folder.mkdir()
    shutil.copy(empty_store, folder / "mlflow.db")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture(scope="session")
def base_paths(tmp_path_factory):
    """60 short labelled synthetic runs (seed 11): the dataset before any retrain."""
    return generate_synthetic_runs(60, tmp_path_factory.mktemp("base_runs"), seed=11, config=RUNS)


@pytest.fixture(scope="session")
def new_paths(tmp_path_factory):
    """12 more runs (seed 12): what a fleet produced since."""
    return generate_synthetic_runs(12, tmp_path_factory.mktemp("new_runs"), seed=12, config=RUNS)


@pytest.fixture
def base(tmp_path, base_paths):
    """This test's own dataset folder, holding a copy of the 60 base runs."""
    folder = tmp_path / "dataset"
    shutil.copytree(base_paths[0].parent, folder)
    return folder
