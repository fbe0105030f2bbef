"""Shared fixtures for the predictor tests: short synthetic runs and one trained model,
and the lifecycle's (``lifecycle/``): a fresh real SQLite MLflow store per test (its
dataset, ``base`` and ``new_paths``, is the root conftest's).

Runs are kept short (600-1,200 steps) so that the whole predictor suite trains once,
in seconds, on a shared 2-core machine. The session-scoped model is trained by the
real pipeline (``train_risk_model``), so every test of RiskModel sees what users get.

A fresh SQLite store costs 5-15 s of schema migration on the shared machine; the session
migrates one empty store and each test gets a copy of its database file (a copy is a new,
independent store), with artifacts beside it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # before lightgbm (docs/stack.md, "OpenMP")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
# The research analyses (group_leads, separability, importance) are scripts' modules in
# benchmarks/, not the wheel's; their tests import them from there, as the scripts do.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import shutil

import pytest
from predictor_settings import FAST_PARAMS, SHORT_RUNS

from collapse_guard.datasets.synthetic.generate import generate_synthetic_runs


@pytest.fixture(scope="session")
def synthetic_paths(tmp_path_factory):
    """60 short labelled synthetic runs (seed 11)."""
    out = tmp_path_factory.mktemp("synthetic_runs")
    return generate_synthetic_runs(60, out, seed=11, config=SHORT_RUNS)


@pytest.fixture(scope="session")
def fresh_paths(tmp_path_factory):
    """40 more short runs from another seed: never seen in training."""
    out = tmp_path_factory.mktemp("fresh_runs")
    return generate_synthetic_runs(40, out, seed=12, config=SHORT_RUNS)


@pytest.fixture(scope="session")
def run_records(synthetic_paths):
    from collapse_guard.runfiles.records import load_runs

    return load_runs(synthetic_paths)


@pytest.fixture(scope="session")
def training(synthetic_paths):
    """The TrainingResult of the full pipeline on the 60 runs."""
    from collapse_guard.predictor.training.train import train_risk_model

    return train_risk_model(synthetic_paths, seed=0, stride=10, params=FAST_PARAMS)


@pytest.fixture(scope="session")
def trained(training):
    """(RiskModel, EvalReport) of :func:`training`."""
    return training.model, training.report


# ------------------------------------------------------------------ the lifecycle's
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
