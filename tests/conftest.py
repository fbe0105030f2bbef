"""Shared test set-up, and the labelled dataset that an ingest and a retrain start from.

OMP_WAIT_POLICY must be set before torch, lightgbm or scikit-learn is imported: with
busy CPUs, spinning OpenMP threads make small fits 100x slower (docs/stack.md, "OpenMP").

The dataset (``base_paths``, ``new_paths``, ``base``) is shared by the run-file tests
(ingest) and the predictor's lifecycle tests (retrain), as one session's draws.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "passive")
os.environ.setdefault("BENTOML_DO_NOT_TRACK", "true")

import shutil

import pytest


def _dataset_runs(n: int, folder, seed: int):
    """``n`` labelled synthetic runs in ``folder``, short and quick to train on: the
    collapses all have a precursor (a sudden one is the guard's reactive path, no
    forecast's) and fewer healthy runs carry decoys."""
    from collapse_guard.datasets.synthetic.generate import generate_synthetic_runs
    from collapse_guard.datasets.synthetic.sampler import SamplerConfig

    config = SamplerConfig(min_steps=600, max_steps=800, sudden_share=0.0, decoy_share=0.3)
    return generate_synthetic_runs(n, folder, seed=seed, config=config)


@pytest.fixture(scope="session")
def base_paths(tmp_path_factory):
    """60 short labelled synthetic runs (seed 11): the dataset before any retrain."""
    return _dataset_runs(60, tmp_path_factory.mktemp("base_runs"), seed=11)


@pytest.fixture(scope="session")
def new_paths(tmp_path_factory):
    """12 more runs (seed 12): what a fleet produced since."""
    return _dataset_runs(12, tmp_path_factory.mktemp("new_runs"), seed=12)


@pytest.fixture
def base(tmp_path, base_paths):
    """This test's own dataset folder, holding a copy of the 60 base runs."""
    folder = tmp_path / "dataset"
    shutil.copytree(base_paths[0].parent, folder)
    return folder
