"""The leaf tables give LightGBM's own TreeSHAP contributions (``pred_contrib``).

Real boosters: the bundled model on real feature rows, and small seeded LightGBM models
trained here for each way a split treats missing values (NaN, zero, none), checked
against ``pred_contrib`` and against path-dependent TreeSHAP computed here the slow way
(every coalition of a tree's features); plus the trees the tables cannot hold (a
categorical split, more than 64 splits in a tree), for which the scorer falls back.
"""

from __future__ import annotations

import math
from itertools import combinations
from typing import Any

import lightgbm as lgb
import numpy as np
import pandas as pd
import pytest

from collapse_guard.service.server.model_state import known_window
from collapse_guard.service.server.scoring import ServedModel
from collapse_guard.service.server.treeshap import build


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


def _feature_rows(model, steps: tuple[int, ...] = (20, 120, 200, 260)) -> np.ndarray:
    """The bundled model's features of fixed windows of ``steps`` steps (no context)."""
    windows = [known_window(model.schema.signals, steps=n) for n in steps]
    frames = [pd.DataFrame({"step": w.steps, **w.columns}) for w in windows]
    return model.extractor.transform_windows(frames, [{}] * len(frames))


def test_bundled_model_contributions_equal_pred_contrib(default_model):
    X = _feature_rows(default_model)
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


# LightGBM's kZeroThreshold (a C float)
_ZERO = float(np.float32(1e-35))


def _goes_left(x: float, node: dict[str, Any]) -> bool:
    """LightGBM's ``NumericalDecision``, written out from its C++, on the value its
    predictor passes: a row is made sparse first, magnitudes up to kZeroThreshold dropped."""
    missing = node["missing_type"]
    if abs(x) <= _ZERO or (math.isnan(x) and missing != "NaN"):
        x = 0.0
    if (missing == "Zero" and x == 0.0) or (missing == "NaN" and math.isnan(x)):
        return bool(node["default_left"])
    return x <= node["threshold"]


def _expected(node: dict[str, Any], x: np.ndarray, known: frozenset[int]) -> float:
    """The tree's expected output given only the features in ``known`` (path-dependent:
    an unknown feature's split averages its children by their training counts)."""
    if "leaf_value" in node:
        return node["leaf_value"]
    left, right = node["left_child"], node["right_child"]
    if node["split_feature"] in known:
        return _expected(left if _goes_left(x[node["split_feature"]], node) else right, x, known)
    counts = [c.get("leaf_count", c.get("internal_count")) for c in (left, right)]
    return (counts[0] * _expected(left, x, known) + counts[1] * _expected(right, x, known)) / sum(
        counts
    )


def _tree_features(node: dict[str, Any]) -> set[int]:
    if "leaf_value" in node:
        return set()
    children = _tree_features(node["left_child"]) | _tree_features(node["right_child"])
    return {node["split_feature"]} | children


def _brute_force_shap(booster: lgb.Booster, x: np.ndarray) -> np.ndarray:
    """Shapley values of each tree's expected output over its own features, summed."""
    phi = np.zeros(len(x))
    for tree in booster.dump_model()["tree_info"]:
        root = tree["tree_structure"]
        features = sorted(_tree_features(root))
        m = len(features)
        for j in features:
            others = [f for f in features if f != j]
            for size in range(m):
                weight = math.factorial(size) * math.factorial(m - size - 1) / math.factorial(m)
                for coalition in combinations(others, size):
                    known = frozenset(coalition)
                    gain = _expected(root, x, known | {j}) - _expected(root, x, known)
                    phi[j] += weight * gain
    return phi


@pytest.mark.parametrize(
    "params",
    [{}, {"zero_as_missing": True}, {"use_missing": False}],
    ids=["nan-missing", "zero-missing", "no-missing"],
)
def test_tables_equal_treeshap_computed_coalition_by_coalition(params):
    booster, X = _small_booster(num_leaves=8, **params)
    tables = build(booster)
    assert tables is not None
    rows = _awkward_rows(X, tables, seed=2)[:12]
    # NaN, 0 and 1e-40 in the same row: every missing-value branch of every split
    rows[0, :3], rows[1, :3], rows[2, :3] = np.nan, 0.0, 1e-40
    expected = np.array([_brute_force_shap(booster, x) for x in rows])
    np.testing.assert_allclose(tables.contributions(rows), expected, rtol=1e-9, atol=1e-12)


def test_one_row_at_a_time_gives_the_batch_numbers_to_the_bit(default_model):
    # one row takes the row kernel, a batch the leaf-by-leaf one: the same sums, in order
    tables = build(default_model.booster)
    X = _feature_rows(default_model, steps=(20, 120, 200))
    rows = np.vstack([X, _awkward_rows(X, tables)[:40]])
    one_by_one = np.vstack([tables.contributions(row[np.newaxis]) for row in rows])
    assert np.array_equal(one_by_one, tables.contributions(rows))
    assert tables.contributions(rows[:0]).shape == (0, tables.n_features)


def _noise_booster(num_leaves: int) -> lgb.Booster:
    """Two trees of ``num_leaves`` leaves each (labels are noise: every split has gain)."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(1500, 6))
    X[rng.random(X.shape) < 0.1] = np.nan
    params = {"objective": "binary", "num_leaves": num_leaves, "min_data_in_leaf": 3}
    data = lgb.Dataset(X, rng.integers(0, 2, len(X)), params={"verbose": -1})
    booster = lgb.train({**params, "verbose": -1}, data, num_boost_round=2)
    assert [t["num_leaves"] for t in booster.dump_model()["tree_info"]] == [num_leaves] * 2
    return booster


def test_a_tree_of_64_splits_is_held_and_of_65_is_not():
    # a row's decisions in one tree are one 64-bit word: split 64 is its sign bit
    booster = _noise_booster(65)
    tables = build(booster)
    assert tables is not None
    rows = _awkward_rows(np.zeros((1, 6)), tables, seed=5)
    np.testing.assert_allclose(
        tables.contributions(rows), _pred_contrib(booster, rows), rtol=1e-9, atol=1e-12
    )
    assert build(_noise_booster(66)) is None


def test_a_booster_of_one_leaf_trees_contributes_nothing():
    rng = np.random.default_rng(6)
    X = rng.normal(size=(50, 3))
    data = lgb.Dataset(X, rng.integers(0, 2, len(X)), params={"verbose": -1})
    # fewer rows than a leaf needs: every tree is its root
    booster = lgb.train({"objective": "binary", "min_data_in_leaf": 100, "verbose": -1}, data, 3)
    tables = build(booster)
    assert tables is not None
    for rows in (X[:1], X):  # the row kernel and the batch kernel
        assert np.array_equal(tables.contributions(rows), np.zeros(rows.shape))
        assert np.array_equal(_pred_contrib(booster, rows), np.zeros(rows.shape))


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
    scorer = ServedModel(default_model, "m", "v")
    scorer.__dict__["_shap_tables"] = None
    X = _feature_rows(default_model, steps=(200,))
    assert np.array_equal(scorer._contributions(X), _pred_contrib(default_model.booster, X))
