"""Calibration improves a deliberately mis-calibrated model and keeps its ranking."""

from __future__ import annotations

import json

import numpy as np
import pytest

from collapse_guard.predictor.calibration import (
    Calibrator,
    brier_score,
    expected_calibration_error,
)


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
    assert brier_score(p, y_test) < brier_score(raw_test, y_test)
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
