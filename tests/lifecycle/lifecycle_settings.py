"""Settings shared by the lifecycle tests (a module name found in no other test folder)."""

from __future__ import annotations

from collapse_guard.datasets.synthetic.sampler import SamplerConfig

SHORT = SamplerConfig(min_steps=600, max_steps=800)  # short runs: seconds per training
FAST_PARAMS = {"n_estimators": 30, "min_child_samples": 40}  # few trees: the loop is tested
