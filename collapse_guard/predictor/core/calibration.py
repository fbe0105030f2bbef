"""Probability calibration, fitted on validation runs and stored as plain JSON.

Two methods, both scikit-learn estimators:

- ``platt`` (default): a ``LogisticRegression`` on the raw score's log-odds,
  ``p = sigmoid(a * logit(raw) + b)``. Strictly increasing, so it keeps the model's
  ranking intact; that matters because alarm levels are thresholds in the far tail
  (1 false alarm per 100,000 healthy steps) where a step function would merge the
  scores that the thresholds must separate.
- ``isotonic``: an ``IsotonicRegression`` (pool-adjacent-violators) on the raw score,
  then linear interpolation between the centres of the pooled blocks. Follows any
  monotone distortion, but is flat beyond the outermost block centres (ties there).

Both are fitted on validation rows (never on training rows: a boosted model is
over-confident on what it was fitted on). A fitted estimator is stored as its few
numbers (``a`` and ``b``; the block centres ``x`` and values ``y``), never pickled, and
rebuilt from them on load: :meth:`Calibrator.from_dict` of a saved model gives the
same probabilities as the calibrator that saved it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from scipy.special import expit
from sklearn.isotonic import IsotonicRegression
from sklearn.linear_model import LogisticRegression

__all__ = ["CALIBRATION_METHODS", "CalibrationDataError", "Calibrator"]

CALIBRATION_METHODS: tuple[str, ...] = ("platt", "isotonic")
# the numbers each method stores (Calibrator.to_dict's "params")
_PARAMS = {"platt": ("a", "b"), "isotonic": ("x", "y")}

# log-odds are clipped here so that raw scores of exactly 0 or 1 stay finite
_EPS = 1e-12


class CalibrationDataError(ValueError):
    """The validation rows cannot calibrate: one outcome only (a fit without them can
    fall back, as cross-fitting does)."""


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), _EPS, 1.0 - _EPS)
    return np.log(p) - np.log1p(-p)


def _fit_platt(z: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Platt's ``(a, b)``: the log loss of sigmoid(a * z + b) against smoothed targets."""
    # Platt's target smoothing, (n+ + 1) / (n+ + 2) and 1 / (n- + 2) instead of 1 and 0,
    # keeps a and b finite when the classes separate perfectly. LogisticRegression
    # takes hard labels only, so each row enters twice, as a 1 weighted by its target t
    # and as a 0 weighted by 1 - t: the same loss. No penalty (C=inf), and Newton's
    # method to a tight tolerance: two parameters on a convex loss.
    n_pos, n_neg = float(y.sum()), float(y.size - y.sum())
    t = np.where(y == 1, (n_pos + 1) / (n_pos + 2), 1 / (n_neg + 2))
    fit = LogisticRegression(C=np.inf, solver="newton-cholesky", tol=1e-12, max_iter=100)
    fit.fit(
        np.concatenate([z, z])[:, None],
        np.r_[np.ones(z.size), np.zeros(z.size)],
        sample_weight=np.r_[t, 1.0 - t],
    )
    return float(fit.coef_[0, 0]), float(fit.intercept_[0])


def _fit_isotonic(x: np.ndarray, y: np.ndarray) -> tuple[list[float], list[float]]:
    """(block centres, block values) of the isotonic fit of ``y`` on ``x``."""
    order = np.argsort(x, kind="stable")
    xs = x[order]
    # one value per pooled block (tied x share a block), strictly increasing block to block
    fitted = IsotonicRegression().fit(x, y).predict(xs)
    starts = np.r_[0, np.flatnonzero(np.diff(fitted)) + 1]
    counts = np.diff(np.r_[starts, xs.size])
    centres = np.add.reduceat(xs, starts) / counts
    return centres.tolist(), fitted[starts].tolist()


def _platt_estimator(a: float, b: float) -> LogisticRegression:
    """The LogisticRegression on the log-odds with slope ``a`` and intercept ``b``."""
    estimator = LogisticRegression()
    estimator.classes_ = np.array([0, 1])
    estimator.coef_ = np.array([[a]], dtype=np.float64)
    estimator.intercept_ = np.array([b], dtype=np.float64)
    estimator.n_features_in_ = 1
    return estimator


def _isotonic_estimator(x: list[float], y: list[float]) -> IsotonicRegression:
    """The IsotonicRegression that interpolates linearly between the points ``(x, y)``.

    Fitted on the points themselves: they are already increasing, so pooling leaves them
    as they are, and outside them the value is clipped to the outermost ones.
    """
    return IsotonicRegression(out_of_bounds="clip").fit(
        np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    )


class Calibrator:
    """Maps raw model probabilities to calibrated ones.

    Args:
        method: ``"platt"`` or ``"isotonic"`` (see the module docstring).
    """

    def __init__(self, method: str = "platt") -> None:
        self.method = method
        self.params_: dict[str, Any] | None = None  # what is stored: see to_dict
        self.estimator_: LogisticRegression | IsotonicRegression | None = None

    def fit(self, raw: np.ndarray, y: np.ndarray) -> Calibrator:
        """Fit on raw probabilities ``raw`` and 0/1 outcomes ``y`` of validation rows."""
        if self.method not in CALIBRATION_METHODS:
            raise ValueError(
                f"calibration method must be one of {CALIBRATION_METHODS}; got {self.method!r}"
            )
        raw = np.asarray(raw, dtype=np.float64)
        y = np.asarray(y).astype(np.int64)
        if raw.shape != y.shape or raw.ndim != 1:
            raise ValueError(
                f"raw and y must be 1-d of equal length; got {raw.shape} and {y.shape}"
            )
        if raw.size == 0 or len(np.unique(y)) < 2:
            raise CalibrationDataError(
                f"calibration needs both outcomes among the validation rows; got {raw.size} rows "
                f"with classes {sorted(np.unique(y).tolist())}. Fix: add collapsing and healthy "
                "runs to the validation split"
            )
        if self.method == "platt":
            a, b = _fit_platt(_logit(raw), y)
            self._set_params({"a": a, "b": b})
        else:
            centres, values = _fit_isotonic(raw, y)
            self._set_params({"x": centres, "y": values})
        return self

    def _set_params(self, params: Mapping[str, Any]) -> None:
        self.params_ = dict(params)
        if self.method == "platt":
            self.estimator_ = _platt_estimator(params["a"], params["b"])
        else:
            self.estimator_ = _isotonic_estimator(params["x"], params["y"])

    def transform(self, raw: np.ndarray) -> np.ndarray:
        """Calibrated probabilities for raw probabilities ``raw`` (NaN stays NaN)."""
        if self.params_ is None:
            raise RuntimeError("this Calibrator is not fitted; call fit(raw, y) first")
        raw = np.asarray(raw, dtype=np.float64)
        # The estimator's own function, computed from its fitted attributes: its
        # predict_proba / predict validate their input on every call, ~0.8 ms against
        # ~15 us for the arithmetic, and this runs on every request the service scores.
        # The tests pin both paths to the same numbers.
        estimator = self.estimator_
        if self.method == "platt":
            out = expit(estimator.coef_[0, 0] * _logit(raw) + estimator.intercept_[0])
        else:  # linear between the thresholds, clipped to the outermost (out_of_bounds="clip")
            out = np.interp(raw, estimator.X_thresholds_, estimator.y_thresholds_)
        return np.where(np.isnan(raw), np.nan, out)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: ``{"method": ..., "params": {...}}``."""
        if self.params_ is None:
            raise RuntimeError("this Calibrator is not fitted; nothing to save")
        return {"method": self.method, "params": dict(self.params_)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Calibrator:
        """Inverse of :meth:`to_dict`."""
        method = data.get("method")
        if method not in CALIBRATION_METHODS or "params" not in data:
            raise ValueError(
                f"calibration dict must have method in {CALIBRATION_METHODS} and params; "
                f"got keys {sorted(data)} and method {method!r}"
            )
        missing = [key for key in _PARAMS[method] if key not in data["params"]]
        if missing:
            raise ValueError(
                f"{method} calibration params must hold {list(_PARAMS[method])}; "
                f"{missing} missing from {sorted(data['params'])}. Fix: save the model again "
                "with RiskModel.save (or retrain it)"
            )
        cal = cls(method)
        cal._set_params(data["params"])
        return cal
