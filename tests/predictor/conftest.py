"""Shared fixtures for the predictor tests: short synthetic runs and one trained model.

Runs are kept short (600-1,200 steps) so that the whole predictor suite trains once,
in seconds, on a shared 2-core machine. The session-scoped model is trained by the
real pipeline (``train_risk_model``), so every test of RiskModel sees what users get.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # before lightgbm (STACK.md)
# The research analyses (family_leads, separability, importance) are scripts' modules in
# benchmarks/, not the wheel's; their tests import them from there, as the scripts do.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import pytest
from predictor_settings import FAST_PARAMS

from collapse_guard.datasets.synthetic.generate import generate_synthetic_runs
from collapse_guard.datasets.synthetic.sampler import SamplerConfig

SHORT = SamplerConfig(min_steps=600, max_steps=1200)


@pytest.fixture(scope="session")
def synthetic_paths(tmp_path_factory):
    """60 short labelled synthetic runs (seed 11)."""
    out = tmp_path_factory.mktemp("synthetic_runs")
    return generate_synthetic_runs(60, out, seed=11, config=SHORT)


@pytest.fixture(scope="session")
def fresh_paths(tmp_path_factory):
    """40 more short runs from another seed: never seen in training."""
    out = tmp_path_factory.mktemp("fresh_runs")
    return generate_synthetic_runs(40, out, seed=12, config=SHORT)


@pytest.fixture(scope="session")
def run_records(synthetic_paths):
    from collapse_guard.datasets.runs import load_runs

    return load_runs(synthetic_paths)


@pytest.fixture(scope="session")
def training(synthetic_paths):
    """The TrainingResult of the full pipeline on the 60 runs."""
    from collapse_guard.predictor.training.train import train_risk_model

    return train_risk_model(synthetic_paths, seed=0, stride=10, params=FAST_PARAMS)


@pytest.fixture(scope="session")
def trained(training):
    """(RiskModel, EvalReport) of :func:`training`."""
    return training.model, training.report
