"""Generate, label and write synthetic runs, in parallel and resumably.

``generate_synthetic_runs(n, out, seed)`` writes ``out/synth-s{seed}-{i:06d}.parquet``
for i in 0 .. n-1. Each run is drawn from its own ``SeedSequence(seed, spawn_key=(i,))``
(``sampler.py``), so the files are identical whatever the worker count; a file that
already exists is skipped, so an interrupted call resumes where it stopped.

Workers are the shared *spawn* process pool of ``datasets.parallel`` (fork after
numpy/OpenMP work can hang the child, docs/stack.md, "OpenMP").
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd

from collapse_guard.datasets.parallel import run_progress, spawn_pool
from collapse_guard.datasets.synthetic.frame import make_frame
from collapse_guard.datasets.synthetic.sampler import SamplerConfig, run_id, sample_spec
from collapse_guard.datasets.synthetic.shapes import dataset_spikes
from collapse_guard.datasets.synthetic.spec import SYNTHETIC_VERSION, RunSpec
from collapse_guard.runfiles import RunMeta, write_run
from collapse_guard.runfiles.label import apply_label, label_run

__all__ = ["generate_synthetic_runs", "synth_run"]

# Runs handed to a worker at a time: large enough to amortise inter-process traffic
# (a run is tens of ms: build, label, write), small enough to keep the bar moving.
_CHUNK = 8


def synth_run(spec: RunSpec) -> tuple[pd.DataFrame, RunMeta]:
    """One run's frame and labelled metadata.

    The label (``label.label_run``) is the ground truth for training; the generator's
    own intent is kept beside it in ``extra`` (``synthetic_kind``, ``synthetic_onset``)
    so the two can be compared (:func:`agreement.label_agreement`).
    """
    frame = make_frame(spec)
    meta = RunMeta(
        run_id=spec.run_id,
        source="synthetic",
        config={
            "generator": "collapse_guard.datasets.synthetic",
            "n_steps": spec.n_steps,
            "vocab_size": spec.vocab,
            "lr": spec.lr_peak,
            "warmup_steps": spec.warmup,
            "schedule": spec.schedule,
            "amp": spec.amp,
        },
        extra={
            "synthetic_version": SYNTHETIC_VERSION,
            "synthetic_kind": spec.kind,
            "synthetic_onset": spec.onset,
            "synthetic_lead": spec.lead,
            "synthetic_rise_steps": spec.rise_steps,
            "synthetic_dsi": spec.dsi,
            "synthetic_decoys": [d.kind for d in spec.decoys],
            "data_spike_steps": [s for s, _ in dataset_spikes(spec.dataset) if s < spec.n_steps],
            "synthetic_spec": spec.to_dict(),
        },
    )
    return frame, apply_label(meta, label_run(frame))


def _one(index: int, seed: int, config: SamplerConfig, out: str) -> str:
    """Worker: sample, build, label and write run ``index``; returns the path."""
    spec = sample_spec(index, seed, config)
    frame, meta = synth_run(spec)
    return str(write_run(Path(out) / f"{spec.run_id}.parquet", frame, meta))


def _results(tasks: list, workers: int) -> Iterator[str]:
    if workers <= 1 or len(tasks) <= _CHUNK:
        return itertools.starmap(_one, tasks)
    return spawn_pool(_one, tasks, workers, chunksize=_CHUNK)


def generate_synthetic_runs(
    n: int,
    out: str | os.PathLike,
    seed: int = 0,
    *,
    workers: int = 1,
    config: SamplerConfig | None = None,
    progress: bool = False,
    on_run: Callable[[Path], None] | None = None,
) -> list[Path]:
    """Write ``n`` labelled synthetic runs under ``out``; return every run's path, in order.

    Existing files are kept (resumable); ``workers`` > 1 uses a spawn process pool
    and does not change any file's content. ``on_run`` is called with each path
    written (not the skipped ones), in completion order.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an int >= 0 (runs to generate), got {n!r}")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}; use 1 to run in this process")
    config = config or SamplerConfig()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{run_id(seed, i)}.parquet" for i in range(n)]
    tasks = [(i, seed, config, str(out)) for i, p in enumerate(paths) if not p.exists()]
    with run_progress("synthetic runs", total=n, done=n - len(tasks), enabled=progress) as advance:
        for written in _results(tasks, workers):
            advance()
            if on_run is not None:
                on_run(Path(written))
    return paths
