"""Calibration improves a deliberately mis-calibrated model and keeps its ranking; the
scikit-learn estimators give the numbers the former hand-written fits gave, and a model
saved before them loads to the same probabilities."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.metrics import brier_score_loss

from collapse_guard.predictor.core.calibration import Calibrator
from collapse_guard.predictor.core.risk import DEFAULT_MODEL_DIR


def expected_calibration_error(p: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    """Weighted mean |observed rate - mean probability| over equal-width probability bins."""
    p, y = np.asarray(p, dtype=np.float64), np.asarray(y, dtype=np.float64)
    idx = np.clip((p * bins).astype(int), 0, bins - 1)
    gaps = [(idx == b).sum() * abs(y[idx == b].mean() - p[idx == b].mean()) for b in set(idx)]
    return float(sum(gaps) / max(p.size, 1))


def _sample(rng, n):
    z = rng.normal(-2.0, 1.5, size=n)
    y = (rng.random(n) < 1 / (1 + np.exp(-z))).astype(int)
    raw = 1 / (1 + np.exp(-(3.0 * z + 2.0)))  # over-confident and biased upward
    return raw, y


@pytest.mark.parametrize("method", ["platt", "isotonic"])
def test_calibration_lowers_brier_and_ece_on_held_out_rows(method):
    rng = np.random.default_rng(0)
    raw_fit, y_fit = _sample(rng, 20_000)
    raw_test, y_test = _sample(rng, 20_000)
    cal = Calibrator(method).fit(raw_fit, y_fit)
    p = cal.transform(raw_test)
    assert brier_score_loss(y_test, p) < brier_score_loss(y_test, raw_test)
    assert expected_calibration_error(p, y_test) < 0.5 * expected_calibration_error(
        raw_test, y_test
    )
    grid = np.linspace(0, 1, 1001)
    assert np.all(np.diff(cal.transform(grid)) >= 0)  # monotone: ranking kept


def test_platt_is_strictly_increasing():
    rng = np.random.default_rng(1)
    cal = Calibrator("platt").fit(*_sample(rng, 5_000))
    assert np.all(np.diff(cal.transform(np.linspace(1e-6, 1 - 1e-6, 1001))) > 0)


@pytest.mark.parametrize("method", ["platt", "isotonic"])
def test_json_round_trip(method):
    rng = np.random.default_rng(2)
    cal = Calibrator(method).fit(*_sample(rng, 2_000))
    again = Calibrator.from_dict(json.loads(json.dumps(cal.to_dict())))
    grid = np.array([0.0, 0.01, 0.3, 0.99, 1.0, np.nan])
    np.testing.assert_array_equal(again.transform(grid), cal.transform(grid))
    assert np.isnan(again.transform(grid)[-1])


def test_errors_say_what_to_do():
    with pytest.raises(RuntimeError, match="not fitted"):
        Calibrator().transform(np.array([0.5]))
    with pytest.raises(ValueError, match="both outcomes"):
        Calibrator().fit(np.array([0.1, 0.2]), np.array([0, 0]))
    with pytest.raises(ValueError, match="one of"):
        Calibrator("beta").fit(np.array([0.1, 0.2]), np.array([0, 1]))
    with pytest.raises(ValueError, match="method in"):
        Calibrator.from_dict({"method": "beta"})
    with pytest.raises(ValueError, match=r"\['b'\] missing"):
        Calibrator.from_dict({"method": "platt", "params": {"a": 1.0}})


# Platt's (a, b) as the former Newton fit gave them (collapse_guard before scikit-learn)
# on _sample(np.random.default_rng(seed), n), and on two separated classes.
_FORMER_PLATT = {
    (3, 2000): (0.29696771663507116, -0.7118789665246784),
    (4, 200): (0.28494160678639097, -0.7910804622895092),
}
_FORMER_SEPARABLE = (3.1426761556621847, -5.249937075144595e-16)


def _separable():
    raw = np.r_[np.linspace(0.01, 0.4, 50), np.linspace(0.6, 0.99, 50)]
    return raw, np.r_[np.zeros(50), np.ones(50)].astype(int)


def _platt_formula(params, raw):
    # the former transform: sigmoid(a * logit(raw) + b), raw clipped to [1e-12, 1 - 1e-12]
    raw = np.clip(raw, 1e-12, 1 - 1e-12)
    return 1 / (1 + np.exp(-(params["a"] * np.log(raw / (1 - raw)) + params["b"])))


@pytest.mark.parametrize(("seed", "n"), sorted(_FORMER_PLATT))
def test_platt_fit_matches_the_former_fit(seed, n):
    cal = Calibrator("platt").fit(*_sample(np.random.default_rng(seed), n))
    np.testing.assert_allclose(
        [cal.params_["a"], cal.params_["b"]], _FORMER_PLATT[seed, n], rtol=1e-8
    )


def test_platt_stays_finite_on_separated_classes():
    cal = Calibrator("platt").fit(*_separable())
    np.testing.assert_allclose(cal.params_["a"], _FORMER_SEPARABLE[0], rtol=1e-8)
    assert abs(cal.params_["b"]) < 1e-8  # symmetric data: no offset


def _former_isotonic(x, y):
    # the former pool-adjacent-violators, one block per run of pooled rows:
    # (mean x, mean y) of each block
    order = np.argsort(x, kind="stable")
    blocks = []  # [sum_y, count, sum_x]
    for xi, yi in zip(x[order], y[order].astype(float), strict=True):
        blocks.append([yi, 1.0, xi])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] >= blocks[-1][0] / blocks[-1][1]:
            s, c, sx = blocks.pop()
            blocks[-1] = [blocks[-1][0] + s, blocks[-1][1] + c, blocks[-1][2] + sx]
    return [b[2] / b[1] for b in blocks], [b[0] / b[1] for b in blocks]


@pytest.mark.parametrize(("seed", "n"), [(5, 3000), (6, 150)])
def test_isotonic_fit_matches_the_former_fit(seed, n):
    raw, y = _sample(np.random.default_rng(seed), n)  # continuous scores: no ties
    cal = Calibrator("isotonic").fit(raw, y)
    centres, values = _former_isotonic(raw, y)
    np.testing.assert_allclose(cal.params_["x"], centres, rtol=1e-12)
    np.testing.assert_allclose(cal.params_["y"], values, rtol=1e-12, atol=1e-15)


def test_isotonic_pools_tied_scores_into_one_block():
    # a booster gives many rows the same score: tied rows share one block whatever their
    # order (the former fit pooled them or not by the order of their outcomes)
    raw = np.repeat([0.1, 0.2, 0.3], 4)
    y = np.array([0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 0])
    cal = Calibrator("isotonic").fit(raw, y)
    # 0.1 and 0.2 both have rate 0.25: pooled, centred at 0.15; 0.3 has rate 0.75
    np.testing.assert_allclose(cal.params_["x"], [0.15, 0.3])
    np.testing.assert_allclose(cal.params_["y"], [0.25, 0.75])
    again = Calibrator("isotonic").fit(raw[::-1], y[::-1])
    assert again.params_ == cal.params_


def test_the_bundled_model_loads_to_the_same_probabilities():
    stored = json.loads((DEFAULT_MODEL_DIR / "risk_model.json").read_text())["calibration"]
    assert stored["method"] == "platt"
    cal = Calibrator.from_dict(stored)
    raw = np.r_[0.0, np.logspace(-9, 0, 400), 1.0]
    np.testing.assert_allclose(cal.transform(raw), _platt_formula(stored["params"], raw), rtol=1e-9)
    assert cal.to_dict() == stored  # saved again, byte for byte the same numbers


def test_an_isotonic_model_saved_before_loads_to_the_same_probabilities():
    stored = {
        "method": "isotonic",
        "params": {"x": [0.02, 0.1, 0.45, 0.8], "y": [0.0, 0.05, 0.3, 0.9]},
    }
    raw = np.r_[np.linspace(0, 1, 501), 1e-6, 0.999999]
    expected = np.interp(raw, stored["params"]["x"], stored["params"]["y"])  # the former transform
    np.testing.assert_array_equal(Calibrator.from_dict(stored).transform(raw), expected)


@pytest.mark.parametrize("method", ["platt", "isotonic"])
def test_transform_is_the_estimators_own_function(method):
    cal = Calibrator(method).fit(*_sample(np.random.default_rng(8), 3000))
    raw = np.r_[0.0, np.linspace(1e-6, 1 - 1e-6, 999), 1.0]
    if method == "platt":
        z = np.log(np.clip(raw, 1e-12, 1 - 1e-12)) - np.log1p(-np.clip(raw, 1e-12, 1 - 1e-12))
        expected = cal.estimator_.predict_proba(z[:, None])[:, 1]
    else:
        expected = cal.estimator_.predict(raw)
    np.testing.assert_allclose(cal.transform(raw), expected, rtol=1e-12, atol=1e-15)


def test_a_nan_slope_loads_and_answers_nan():
    # the service's tests serve such a model to see a NaN answer handled
    cal = Calibrator.from_dict({"method": "platt", "params": {"a": float("nan"), "b": 0.0}})
    assert np.isnan(cal.transform(np.array([0.1, 0.5]))).all()
