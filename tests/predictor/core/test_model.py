"""CollapsePredictor follows the scikit-learn estimator contract (docs/design.md, "Predictor")."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.exceptions import NotFittedError
from sklearn.utils.estimator_checks import parametrize_with_checks
from sklearn.utils.validation import check_is_fitted

from collapse_guard.predictor.core.model import CollapsePredictor, FeatureMismatchError

# Small data in scikit-learn's checks (tens of rows): leaves may hold few rows.
_SMALL = CollapsePredictor(n_estimators=30, min_child_samples=2, subsample=1.0)


# The whole of scikit-learn's suite applies (NaN checks adapt to the allow_nan tag), but
# one: a weight of 2 is not two copies of a row in LightGBM (min_data_in_leaf counts rows,
# and the bins are found on the rows as given), as LightGBM's own estimators declare.
_NOT_LIGHTGBM = "LightGBM: a row weighed 2 is not two rows (leaf sizes count rows; bins)"


@parametrize_with_checks(
    [_SMALL],
    expected_failed_checks=lambda _: {
        "check_sample_weight_equivalence_on_dense_data": _NOT_LIGHTGBM,
    },
)
def test_sklearn_contract(estimator, check):
    check(estimator)


def _data(n=400, seed=0):
    rng = np.random.default_rng(seed)
    X = pd.DataFrame(rng.normal(size=(n, 4)), columns=["a", "b", "c", "d"])
    X.iloc[::7, 1] = np.nan  # NaN is "missing", never an error
    y = (X["a"] + 0.5 * rng.normal(size=n) > 1).astype(int).to_numpy()
    return X, y


def test_fit_returns_self_and_sets_fitted_attributes():
    X, y = _data()
    est = CollapsePredictor(n_estimators=20, n_jobs=1)
    with pytest.raises(NotFittedError):
        check_is_fitted(est)
    assert est.fit(X, y) is est
    check_is_fitted(est)
    assert est.feature_names_in_.tolist() == ["a", "b", "c", "d"]
    assert est.n_features_in_ == 4 and est.classes_.tolist() == [0, 1]
    assert est.horizon_ == 200
    proba = est.predict_proba(X)
    assert proba.shape == (len(X), 2) and np.allclose(proba.sum(axis=1), 1)


def test_refit_discards_previous_fit():
    X, y = _data()
    est = CollapsePredictor(n_estimators=20).fit(X, y)
    est.fit(X.to_numpy()[:, :3], y)
    assert not hasattr(est, "feature_names_in_") and est.n_features_in_ == 3
    assert est.booster_.num_feature() == 3


def test_schema_mismatch_lists_missing_and_unexpected_names():
    X, y = _data()
    est = CollapsePredictor(n_estimators=20).fit(X, y)
    bad = X.rename(columns={"b": "bb"}).drop(columns=["d"])
    with pytest.raises(FeatureMismatchError, match="missing: b, d; unexpected: bb"):
        est.predict_proba(bad)
    reordered = X[["d", "c", "b", "a"]]
    np.testing.assert_array_equal(est.predict_proba(reordered), est.predict_proba(X))


def test_same_seed_same_model_string():
    X, y = _data()
    a = CollapsePredictor(n_estimators=30, random_state=3).fit(X, y).booster_.model_to_string()
    b = CollapsePredictor(n_estimators=30, random_state=3).fit(X, y).booster_.model_to_string()
    assert a == b


def test_early_stopping_keeps_only_the_chosen_trees():
    X, y = _data()
    Xv, yv = _data(seed=1)
    est = CollapsePredictor(n_estimators=300, early_stopping_rounds=5).fit(X, y, eval_set=(Xv, yv))
    assert est.booster_.num_trees() == est.best_iteration_ < 300


def test_one_class_is_an_error_that_says_why():
    X, _ = _data()
    with pytest.raises(ValueError, match="exactly 2 classes"):
        CollapsePredictor().fit(X, np.zeros(len(X)))


def test_unit_weights_give_the_unweighted_model_and_weights_move_the_risk():
    X, y = _data()
    unweighted = CollapsePredictor(n_estimators=30).fit(X, y)
    ones = CollapsePredictor(n_estimators=30).fit(X, y, np.ones(len(y)))
    assert ones.booster_.model_to_string() == unweighted.booster_.model_to_string()
    # the positives weighed 5: the model pays more for missing them, so it calls more
    heavy = CollapsePredictor(n_estimators=30).fit(X, y, np.where(y == 1, 5.0, 1.0))
    gain = heavy.predict_proba(X)[:, 1].mean() - unweighted.predict_proba(X)[:, 1].mean()
    assert gain > 0.05


def test_a_negative_weight_is_refused():
    X, y = _data()
    with pytest.raises(ValueError, match=r"[Nn]egative"):
        CollapsePredictor(n_estimators=5).fit(X, y, np.full(len(y), -1.0))
