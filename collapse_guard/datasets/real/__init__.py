"""Real runs: small transformers trained here, recorded by the probe, labelled, written.

``generate_real_runs(n, out, workers=2)`` draws ``n`` configs (``sample_configs``),
trains each on byte-level standard-library text (``corpus``) with its knobs and
injected fault, and writes one labelled run file per run. Nothing here imports torch
at import time: the workers do, each on its own.
"""

from collapse_guard.datasets.real.config import FAULTS, PRECISIONS, RealRunConfig
from collapse_guard.datasets.real.pool import generate_real_runs, run_id_for
from collapse_guard.datasets.real.sampler import RECIPES, sample_config, sample_configs

__all__ = [
    "FAULTS",
    "PRECISIONS",
    "RECIPES",
    "RealRunConfig",
    "generate_real_runs",
    "run_id_for",
    "sample_config",
    "sample_configs",
]
