"""Probability calibration, fitted on validation runs and stored as plain JSON.

Two methods:

- ``platt`` (default): a logistic regression on the raw score's log-odds,
  ``p = sigmoid(a * logit(raw) + b)``. Strictly increasing, so it keeps the model's
  ranking intact; that matters because alarm levels are thresholds in the far tail
  (1 false alarm per 100,000 healthy steps) where a step function would merge the
  scores that the thresholds must separate.
- ``isotonic``: pool-adjacent-violators on the raw score, then linear interpolation
  between the centres of the pooled blocks. Follows any monotone distortion, but is
  flat beyond the outermost block centres (ties there).

Both are fitted on validation rows (never on training rows: a boosted model is
over-confident on what it was fitted on).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["CALIBRATION_METHODS", "Calibrator", "brier_score", "expected_calibration_error"]

CALIBRATION_METHODS: tuple[str, ...] = ("platt", "isotonic")

# log-odds are clipped here so that raw scores of exactly 0 or 1 stay finite
_EPS = 1e-12


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), _EPS, 1.0 - _EPS)
    return np.log(p) - np.log1p(-p)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # overflow-free form of 1 / (1 + exp(-z))


def _platt_loss(a: float, b: float, z: np.ndarray, t: np.ndarray) -> float:
    m = a * z + b
    # log(1 + exp(m)) - t * m, written to stay finite for large |m|
    return float(np.sum(np.logaddexp(0.0, m) - t * m))


def _fit_platt(z: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    # Platt's target smoothing keeps a and b finite when the classes separate perfectly
    n_pos, n_neg = float(y.sum()), float(y.size - y.sum())
    t = np.where(y == 1, (n_pos + 1) / (n_pos + 2), 1 / (n_neg + 2))
    a, b = 1.0, 0.0
    loss = _platt_loss(a, b, z, t)
    for _ in range(100):  # Newton's method with backtracking on the convex log loss
        p = _sigmoid(a * z + b)
        w = np.maximum(p * (1 - p), 1e-12)
        g = np.array([np.dot(p - t, z), np.sum(p - t)])
        h = np.array([[np.dot(w, z * z), np.dot(w, z)], [np.dot(w, z), w.sum()]])
        step = np.linalg.solve(h + 1e-9 * np.eye(2), g)
        scale = 1.0
        while scale > 1e-8:
            new_loss = _platt_loss(a - scale * step[0], b - scale * step[1], z, t)
            if new_loss <= loss:
                break
            scale /= 2  # a full Newton step can overshoot far from the optimum
        a, b = a - scale * step[0], b - scale * step[1]
        converged = loss - new_loss < 1e-10 * max(1.0, abs(loss))
        loss = min(loss, new_loss)
        if converged:
            break
    return float(a), float(b)


def _fit_isotonic(x: np.ndarray, y: np.ndarray) -> tuple[list[float], list[float]]:
    order = np.argsort(x, kind="stable")
    xs, ys = x[order], y[order].astype(np.float64)
    # pool-adjacent-violators over blocks: [sum_y, count, sum_x]
    blocks: list[list[float]] = []
    for xi, yi in zip(xs, ys, strict=True):
        blocks.append([yi, 1.0, xi])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] >= blocks[-1][0] / blocks[-1][1]:
            s, c, sx = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
            blocks[-1][2] += sx
    centres = [b[2] / b[1] for b in blocks]
    values = [b[0] / b[1] for b in blocks]
    return centres, values


class Calibrator:
    """Maps raw model probabilities to calibrated ones.

    Args:
        method: ``"platt"`` or ``"isotonic"`` (see the module docstring).
    """

    def __init__(self, method: str = "platt") -> None:
        self.method = method
        self.params_: dict[str, Any] | None = None

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
            raise ValueError(
                f"calibration needs both outcomes among the validation rows; got {raw.size} rows "
                f"with classes {sorted(np.unique(y).tolist())}. Fix: add collapsing and healthy "
                "runs to the validation split"
            )
        if self.method == "platt":
            a, b = _fit_platt(_logit(raw), y)
            self.params_ = {"a": a, "b": b}
        else:
            centres, values = _fit_isotonic(raw, y)
            self.params_ = {"x": centres, "y": values}
        return self

    def transform(self, raw: np.ndarray) -> np.ndarray:
        """Calibrated probabilities for raw probabilities ``raw`` (NaN stays NaN)."""
        if self.params_ is None:
            raise RuntimeError("this Calibrator is not fitted; call fit(raw, y) first")
        raw = np.asarray(raw, dtype=np.float64)
        if self.method == "platt":
            out = _sigmoid(self.params_["a"] * _logit(raw) + self.params_["b"])
        else:
            out = np.interp(raw, self.params_["x"], self.params_["y"])
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
        cal = cls(method)
        cal.params_ = dict(data["params"])
        return cal


def brier_score(p: np.ndarray, y: np.ndarray) -> float:
    """Mean squared error between probabilities and 0/1 outcomes."""
    p, y = np.asarray(p, dtype=np.float64), np.asarray(y, dtype=np.float64)
    return float(np.mean((p - y) ** 2))


def expected_calibration_error(p: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    """Weighted mean |observed rate - mean probability| over equal-width probability bins."""
    p, y = np.asarray(p, dtype=np.float64), np.asarray(y, dtype=np.float64)
    idx = np.clip((p * bins).astype(int), 0, bins - 1)
    total = 0.0
    for b in range(bins):
        mask = idx == b
        if mask.any():
            total += mask.sum() * abs(y[mask].mean() - p[mask].mean())
    return float(total / max(p.size, 1))
