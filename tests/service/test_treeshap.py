"""The leaf tables give LightGBM's own TreeSHAP contributions (``pred_contrib``).

Real boosters: the bundled model on real feature rows, and small seeded LightGBM models
trained here for each way a split treats missing values (NaN, zero, none), plus one with
a categorical split, which the tables cannot hold (the scorer falls back).
"""

from __future__ import annotations

import lightgbm as lgb
import numpy as np
import pytest

from collapse_guard.service.model_state import known_window
from collapse_guard.service.scoring import Scorer
from collapse_guard.service.treeshap import build


def _pred_contrib(booster: lgb.Booster, X: np.ndarray) -> np.ndarray:
    return booster.predict(X, pred_contrib=True, num_threads=1)[:, :-1]


def _awkward_rows(X: np.ndarray, tables, seed: int = 1) -> np.ndarray:
    """Copies of ``X`` with NaN, zeros, values below 1e-35 and exact split thresholds."""
    rng = np.random.default_rng(seed)
    rows = X[rng.integers(0, len(X), 400)].copy()
    rows[rng.random(rows.shape) < 0.2] = np.nan
    rows[rng.random(rows.shape) < 0.05] = 0.0
    rows[rng.random(rows.shape) < 0.05] = 1e-40
    picked = rng.integers(0, len(tables.threshold), 1000)
    rows[rng.integers(0, len(rows), 1000), tables.split_feature[picked]] = tables.threshold[picked]
    return rows


def test_bundled_model_contributions_equal_pred_contrib(default_model):
    scorer = Scorer(default_model, "m", "v")
    windows = [known_window(scorer.signals, steps=n) for n in (20, 120, 200, 260)]
    X = scorer.features(windows)
    tables = build(default_model.booster)
    assert tables is not None
    rows = np.vstack([X, _awkward_rows(X, tables)])
    got, expected = tables.contributions(rows), _pred_contrib(default_model.booster, rows)
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)
    # the same top factors, in the same order, as pred_contrib's
    top = np.argsort(-np.abs(got), axis=1, kind="stable")[:, :5]
    assert np.array_equal(top, np.argsort(-np.abs(expected), axis=1, kind="stable")[:, :5])


def _small_booster(seed: int = 0, **params) -> tuple[lgb.Booster, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(600, 6))
    X[rng.random(X.shape) < 0.15] = np.nan
    X[rng.random(X.shape) < 0.15] = 0.0
    y = (np.nan_to_num(X[:, 0]) + np.nan_to_num(X[:, 1]) * np.isnan(X[:, 2]) > 0.2).astype(int)
    settings = {"objective": "binary", "num_leaves": 31, "min_data_in_leaf": 5, "verbose": -1}
    data = lgb.Dataset(X, y, params={"verbose": -1, **params})
    return lgb.train({**settings, **params}, data, num_boost_round=15), X


@pytest.mark.parametrize(
    "params",
    [{}, {"zero_as_missing": True}, {"use_missing": False}],
    ids=["nan-missing", "zero-missing", "no-missing"],
)
def test_every_missing_value_rule_equals_pred_contrib(params):
    booster, X = _small_booster(**params)
    tables = build(booster)
    assert tables is not None
    rows = np.vstack([X, _awkward_rows(X, tables)])
    np.testing.assert_allclose(
        tables.contributions(rows), _pred_contrib(booster, rows), rtol=1e-9, atol=1e-12
    )


def test_a_categorical_split_falls_back_to_pred_contrib(default_model):
    rng = np.random.default_rng(3)
    X = np.column_stack([rng.integers(0, 5, 500), rng.normal(size=500)]).astype(float)
    y = (X[:, 0] % 2 == 0).astype(int)
    booster = lgb.train(
        {"objective": "binary", "verbose": -1, "min_data_in_leaf": 5},
        lgb.Dataset(X, y, categorical_feature=[0]),
        num_boost_round=5,
    )
    assert build(booster) is None
    # the scorer of a model without tables answers with pred_contrib itself
    scorer = Scorer(default_model, "m", "v")
    scorer.__dict__["_shap_tables"] = None
    X = scorer.features([known_window(scorer.signals)])
    assert np.array_equal(scorer._contributions(X), _pred_contrib(default_model.booster, X))
