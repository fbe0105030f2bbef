"""Shared, cached set-up of the predictor-ops tests (registry, cli, fleet, bundle).

Imported explicitly by those test modules. The costly things (synthetic runs, one
training, one SQLite MLflow store) are made once per test session: each helper is
cached on the session's base temporary folder, so modules that import it share one.
"""

from __future__ import annotations

import functools
from pathlib import Path

N_RUNS = 48  # enough runs for every split to hold collapses of several kinds
SEED = 3


@functools.cache
def synthetic_run_paths(root: Path) -> tuple[Path, ...]:
    """N_RUNS labelled synthetic runs under ``root/ops_runs``."""
    from collapse_guard.datasets.synthetic.generate import generate_synthetic_runs

    return tuple(generate_synthetic_runs(N_RUNS, root / "ops_runs", seed=SEED))


@functools.cache
def training(root: Path):
    """The TrainingResult of one training on the synthetic runs."""
    from collapse_guard.predictor.training.train import train_risk_model

    return train_risk_model(synthetic_run_paths(root), seed=0)


@functools.cache
def trained(root: Path):
    """(RiskModel, EvalReport, {split name: RunRecords}) of :func:`training`."""
    from collapse_guard.runfiles.records import load_runs

    result = training(root)
    by_id = {r.run_id: r for r in load_runs(synthetic_run_paths(root))}
    splits = {role: [by_id[i] for i in result.ids(role)] for role in result.counts()}
    return result.model, result.report, splits


@functools.cache
def mlflow_store(root: Path) -> str:
    """URI of a SQLite MLflow store, created (schema migrated, ~5 s) once per session."""
    import mlflow

    folder = root / "mlflow"
    folder.mkdir(exist_ok=True)
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    mlflow.MlflowClient(tracking_uri=uri).search_experiments()  # runs the migrations
    return uri
