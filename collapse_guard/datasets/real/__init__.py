"""Real runs: small transformers trained here, recorded by the probe, labelled, written.

``generate_real_runs(n, out, workers=2)`` draws ``n`` configs (``sample_configs``:
a model family of ``models/``, an optimizer of ``optim``, a kind of data of ``data``
and a recipe), trains each with its knobs and injected fault, and writes one labelled
run file per run, with its triggers and how soon its collapse followed them
(``onset``). Nothing here imports torch at import time: the workers do, each on its own.
"""

from collapse_guard.datasets.real.config import (
    DATA_KINDS,
    FAMILIES,
    FAULTS,
    OPTIMIZERS,
    PRECISIONS,
    RealRunConfig,
)
from collapse_guard.datasets.real.pool import generate_real_runs, run_id_for
from collapse_guard.datasets.real.sampler import RECIPES, Focus
from collapse_guard.datasets.real.sweeps import sample_config, sample_configs

__all__ = [
    "DATA_KINDS",
    "FAMILIES",
    "FAULTS",
    "OPTIMIZERS",
    "PRECISIONS",
    "RECIPES",
    "Focus",
    "RealRunConfig",
    "generate_real_runs",
    "run_id_for",
    "sample_config",
    "sample_configs",
]
