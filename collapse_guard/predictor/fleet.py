"""Fleet scale: features with Dask over many run files, LightGBM trained with ``lightgbm.dask``.

Only the two costly steps leave the process: feature extraction (each worker reads its
chunk of run files and computes their training rows, which stay on the workers) and the
LightGBM fit (``DaskLGBMClassifier``, data-parallel over the workers' partitions). The
fitted model comes back with ``to_local()`` and enters the same pipeline as a local
fit: calibration on validation rows, level thresholds, evaluation, ``RiskModel``.

>>> with fleet_client("local") as client:          # or "tcp://scheduler:8786"
...     model, report = train_risk_model(paths, fit=partial(fit_on_cluster, client=client))

``lightgbm.dask`` has no early stopping, and its evaluation sets are unreliable when a
worker holds no validation partition; the equivalent here is to train the full number
of rounds, then keep the trees up to the round with the lowest log loss on the
validation rows (gathered locally anyway, for calibration), as the local fit keeps its
best iteration. Data-parallel histograms differ slightly from single-process ones, so the
trees are close to, not equal to, a local fit's (``tests/predictor/test_fleet.py``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import lightgbm as lgb
import numpy as np
import pandas as pd

from collapse_guard.datasets.label import HORIZON
from collapse_guard.features import DEFAULT_WINDOW, FeatureExtractor
from collapse_guard.predictor.calibration import Calibrator
from collapse_guard.predictor.model import CollapsePredictor
from collapse_guard.predictor.risk import RiskModel
from collapse_guard.predictor.training_data import (
    DEFAULT_STRIDE,
    MODEL_SIGNALS,
    RunRecord,
    build_training_data,
    load_runs,
)

__all__ = ["CHUNK_RUNS", "chunk_rows", "fit_on_cluster", "fleet_client"]

CHUNK_RUNS = 16  # run files per task: enough work per task to hide Dask's ~ms overhead
_TARGET = "__target__"  # the label travels as a column of its partition, aligned by design


@contextmanager
def fleet_client(scheduler: str = "local"):
    """A Dask client: ``"local"`` starts a 2-worker LocalCluster, else a scheduler address."""
    from distributed import Client, LocalCluster

    # Workers are spawned and inherit the environment: without a passive wait policy
    # their OpenMP threads spin on a busy machine (../shared/STACK.md).
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    if scheduler == "local":
        cluster = LocalCluster(
            n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=None
        )
        with cluster, Client(cluster) as client:
            yield client
        return
    if "://" not in scheduler:
        raise ValueError(
            f"--dask expects 'local' or a scheduler address like tcp://host:8786; got {scheduler!r}"
        )
    with Client(scheduler) as client:
        yield client


def chunk_rows(
    paths: Sequence[str],
    *,
    window: int,
    signals: Sequence[str],
    stride: int,
    horizon: int,
    names: Sequence[str],
) -> pd.DataFrame:
    """Worker task: training rows of a chunk of run files, target as one more column."""
    extractor = FeatureExtractor(window=window, signals=signals)
    data = build_training_data(load_runs(paths), extractor, stride=stride, horizon=horizon)
    rows = data.X[list(names)].astype(np.float64)
    rows[_TARGET] = data.y.astype(np.int8)
    return rows


def _rows_on_cluster(client, runs: Sequence[RunRecord], **task: Any):
    import dask
    import dask.dataframe as dd

    paths = []
    for run in runs:
        if run.path is None:
            raise ValueError(
                f"run {run.run_id!r} has no file: fleet training ships run files to the "
                "workers; expected RunRecords from load_runs(paths); fix: write the run "
                "with datasets.runfile.write_run first"
            )
        paths.append(str(run.path))
    chunks = [paths[i : i + CHUNK_RUNS] for i in range(0, len(paths), CHUNK_RUNS)]
    meta = pd.DataFrame({n: pd.Series(dtype=np.float64) for n in task["names"]})
    meta[_TARGET] = pd.Series(dtype=np.int8)
    parts = [dask.delayed(chunk_rows)(chunk, **task) for chunk in chunks]
    # persist: the features are computed once, on the workers, and stay there for the fit
    return client.persist(dd.from_delayed(parts, meta=meta, verify_meta=False))


def _sklearn_params(predictor: CollapsePredictor) -> dict[str, Any]:
    # The local predictor's hyperparameters, spelled as LightGBM's sklearn wrapper wants
    # them, so that both paths train the same model family.
    p = predictor
    return {
        "n_estimators": p.n_estimators,
        "learning_rate": p.learning_rate,
        "num_leaves": p.num_leaves,
        "min_child_samples": p.min_child_samples,
        "subsample": p.subsample,
        "subsample_freq": 1 if p.subsample < 1.0 else 0,
        "colsample_bytree": p.colsample_bytree,
        "reg_lambda": p.reg_lambda,
        "random_state": p.random_state,
        "deterministic": True,
        "force_row_wise": True,
        "verbosity": -1,
    }


def _best_iteration(booster: lgb.Booster, x: np.ndarray, y: np.ndarray, threads: int) -> int:
    # Validation log loss after each round, from each tree's raw contribution summed up:
    # one pass over the trees instead of one prediction per candidate length.
    raw = np.zeros(len(y))
    losses = []
    for i in range(booster.num_trees()):
        raw += booster.predict(
            x, start_iteration=i, num_iteration=1, raw_score=True, num_threads=threads
        )
        p = np.clip(1.0 / (1.0 + np.exp(-raw)), 1e-12, 1 - 1e-12)
        losses.append(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
    return int(np.argmin(losses)) + 1


def fit_on_cluster(
    train_runs: Sequence[RunRecord],
    val_runs: Sequence[RunRecord],
    *,
    client,
    seed: int = 0,
    window: int = DEFAULT_WINDOW,
    horizon: int = HORIZON,
    stride: int = DEFAULT_STRIDE,
    calibration: str = "platt",
    params: Mapping[str, Any] | None = None,
    signals: Sequence[str] = MODEL_SIGNALS,
) -> tuple[RiskModel, Any]:
    """Drop-in for ``train.fit_risk_model`` that extracts features and fits on ``client``."""
    from lightgbm.dask import DaskLGBMClassifier

    extractor = FeatureExtractor(window=window, signals=signals)
    names = list(extractor.schema.names)
    task = {
        "window": window,
        "signals": list(extractor.signals),
        "stride": stride,
        "horizon": horizon,
        "names": names,
    }
    train = _rows_on_cluster(client, train_runs, **task)
    val = _rows_on_cluster(client, val_runs, **task)
    predictor = CollapsePredictor(horizon=horizon, random_state=seed, **dict(params or {}))
    dask_model = DaskLGBMClassifier(client=client, **_sklearn_params(predictor))
    with warnings.catch_warnings():
        # lightgbm.dask sets threads from the workers and says so for the wrapper's own
        # n_jobs default on every fit; the warning carries no information here.
        warnings.filterwarnings("ignore", message="Parameter n_jobs will be ignored")
        dask_model.fit(train[names], train[_TARGET])
    val_rows = client.compute(val).result()
    val_y = val_rows.pop(_TARGET).to_numpy()
    val_x = val_rows[names].to_numpy()
    full = dask_model.to_local().booster_
    best = _best_iteration(full, val_x, val_y, predictor.n_jobs)
    # keep only the rounds up to the best validation loss: the local fit's early stopping
    booster = lgb.Booster(model_str=full.model_to_string(num_iteration=best))
    raw = booster.predict(val_x, num_threads=predictor.n_jobs)
    model = RiskModel(
        booster,
        extractor.schema,
        Calibrator(calibration).fit(raw, val_y),
        thresholds={},
        horizon=horizon,
        meta={
            "seed": seed,
            "stride": stride,
            "train_rows": int(train.shape[0].compute()),
            "train_positive_rows": int(train[_TARGET].sum().compute()),
            "best_iteration": best,
            "params": predictor.get_params(),
            "trainer": f"lightgbm.dask on {len(client.scheduler_info()['workers'])} workers",
        },
    )
    return model, dask_model
