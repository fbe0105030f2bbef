"""Constants shared by the predictor fixtures (conftest.py) and the tests that use them."""

from __future__ import annotations

__all__ = ["FAST_PARAMS"]

FAST_PARAMS = {"n_estimators": 60, "min_child_samples": 40}  # small fits for tests
