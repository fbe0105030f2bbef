"""Settings shared by the predictor fixtures (conftest.py) and the tests that use them.

A module name found in no other test folder. Two sets: the predictor's (one model trained
once per session on short runs, its accuracy checked) and the lifecycle's (``lifecycle/``:
the loop is under test, not the accuracy, so the model and its budgets are small, chosen
so that a challenger trained in seconds on the root conftest's short runs catches
collapses within its own budget: 30 trees; a warn budget of one false alarm per 500
healthy steps (measured: a model trained on 60 short runs sets its level on ~7,000
healthy validation steps and cannot honour the default one per 10,000 on other runs)).
"""

from __future__ import annotations

from collapse_guard.datasets.synthetic.sampler import SamplerConfig

__all__ = [
    "FAST_PARAMS",
    "LIFECYCLE_BUDGETS",
    "LIFECYCLE_PARAMS",
    "LIFECYCLE_TRAINING",
    "SHORT_RUNS",
]

SHORT_RUNS = SamplerConfig(min_steps=600, max_steps=1200)  # the whole suite trains in seconds
FAST_PARAMS = {"n_estimators": 60, "min_child_samples": 40}  # small fits for tests

LIFECYCLE_PARAMS = {"n_estimators": 30, "min_child_samples": 40}
# healthy steps per false alarm
LIFECYCLE_BUDGETS = {"watch": 100, "warn": 500, "critical": 10_000}
# retrain's training keywords; every row of the horizon as positives, spelled out: a retrain
# trains as its champion did, and a calibrated bundled model was trained on the rows within
# 100 steps of the onset, which on these short synthetic runs ranks worse (data.POSITIVES_WITHIN)
LIFECYCLE_TRAINING = {
    "params": LIFECYCLE_PARAMS,
    "budgets": LIFECYCLE_BUDGETS,
    "positives_within": None,
}
