"""Synthetic runs: every probe signal, for healthy runs, recovered spikes and collapses.

A generator of run files for training and testing the predictor, fast enough for
10,000 runs in minutes on two cores. One run = one :class:`RunSpec` (drawn by
``sampler.sample_spec``) turned into a frame by :func:`make_frame`, labelled by the
project's label and written as a run file (``source="synthetic"``)::

    from collapse_guard.datasets.synthetic import generate_synthetic_runs
    paths = generate_synthetic_runs(1000, "runs/synth", seed=0, workers=2)

Modules: ``spec`` (the recipe), ``sampler`` (the mix), ``shapes`` (schedule, ramps,
spikes), ``traces`` (one builder per signal group), ``amp`` (GradScaler replay),
``frame`` (assembly: periods, divergence, gaps), ``generate`` (pool, label, files),
``agreement`` (generator vs label), ``realism`` (synthetic vs real statistics),
``shortcuts`` (does anything separate synthetic collapses from healthy runs that
should not: precursor rates and single-signal AUROC), ``cli`` (``collapse-guard data
synth``).

Healthy runs carry the collapses' precursors too, as decoys that peak and resolve
(``RunSpec.decoys``): a precursor only collapses carry is a shortcut a predictor
learns from synthetic runs and never finds in real ones (issue 8).
"""

from collapse_guard.datasets.synthetic.agreement import AgreementReport, label_agreement
from collapse_guard.datasets.synthetic.frame import make_frame
from collapse_guard.datasets.synthetic.generate import generate_synthetic_runs, synth_run
from collapse_guard.datasets.synthetic.sampler import SamplerConfig, sample_spec
from collapse_guard.datasets.synthetic.shapes import dataset_spikes
from collapse_guard.datasets.synthetic.spec import COLLAPSE_KINDS, KINDS, RunSpec

__all__ = [
    "BOUNDS",
    "COLLAPSE_KINDS",
    "KINDS",
    "AgreementReport",
    "RealismReport",
    "RunSpec",
    "SamplerConfig",
    "compare_run_sets",
    "dataset_spikes",
    "generate_synthetic_runs",
    "label_agreement",
    "make_frame",
    "run_stats",
    "sample_spec",
    "stats_table",
    "synth_run",
]

# Loaded on first use, so that `python -m collapse_guard.datasets.synthetic.realism`
# runs the module fresh (no runpy warning about a module imported twice).
_REALISM = ("BOUNDS", "RealismReport", "compare_run_sets", "run_stats", "stats_table")


def __getattr__(name: str):
    if name in _REALISM:
        from collapse_guard.datasets.synthetic import realism

        return getattr(realism, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
