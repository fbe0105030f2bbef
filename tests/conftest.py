"""Shared test set-up.

OMP_WAIT_POLICY must be set before torch, lightgbm or scikit-learn is imported: with
busy CPUs, spinning OpenMP threads make small fits 100x slower (../shared/STACK.md).
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "passive")
os.environ.setdefault("BENTOML_DO_NOT_TRACK", "true")
