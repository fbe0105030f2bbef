"""Settings shared by the lifecycle tests (a module name found in no other test folder).

The loop is under test, not the accuracy, so the runs, the model and its budgets are small,
chosen so that a challenger trained in seconds catches collapses within its own budget:
short runs, collapses that all have a precursor (a sudden one is the guard's reactive
path, no forecast's), fewer decoys; 30 trees; a warn budget of one false alarm per 500
healthy steps (measured: a model trained on 60 short runs sets its level on ~7,000 healthy
validation steps and cannot honour the default one per 10,000 on other runs).
"""

from __future__ import annotations

from collapse_guard.datasets.synthetic.sampler import SamplerConfig

RUNS = SamplerConfig(min_steps=600, max_steps=800, sudden_share=0.0, decoy_share=0.3)
FAST_PARAMS = {"n_estimators": 30, "min_child_samples": 40}
BUDGETS = {"watch": 100, "warn": 500, "critical": 10_000}  # healthy steps per false alarm
TRAINING = {"params": FAST_PARAMS, "budgets": BUDGETS}  # retrain's training keywords
