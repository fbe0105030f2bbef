"""The frozen benchmark: runs no model trains on, chosen once, on which every retrain compares.

A promotion compares the challenger with the champion on runs neither has seen. Scoring
both on the challenger's own test split does not do that: the champion trained on most
of it (issue 11 measured 8 of 13 runs). So the first retrain sets runs apart, once, and
records them in MLflow: every later retrain finds the record, keeps those runs out of the
challenger's training and scores both models on them.

The record is one MLflow run in the experiment, tagged ``collapse_guard.role =
frozen-benchmark``, holding the runs as an MLflow dataset (``mlflow.log_input``,
context ``benchmark``: name, digest, source folder, row count) and their ids as the
artifact ``benchmark/run_ids.json`` (a dataset record keeps no rows). The digest is
the SHA-256 of the sorted ids; reading checks the artifact against it. When several
records exist (two first retrains at once), the oldest is the benchmark.

Which runs: a seeded share of the dataset, stratified by outcome and source, chosen
among the runs the current champion never trained or validated on (its test runs,
``predictor.core.seen_runs``), so that the champion can be scored on them too.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from collapse_guard.errors import UserInputError
from collapse_guard.predictor.core.store import use_store
from collapse_guard.runfiles import RunMeta

__all__ = [
    "BENCHMARK_CONTEXT",
    "BENCHMARK_NAME",
    "BENCHMARK_SHARE",
    "ROLE_TAG",
    "FrozenBenchmark",
    "choose_benchmark",
    "find_benchmark",
    "ids_digest",
    "record_benchmark",
]

BENCHMARK_NAME = "collapse-guard-frozen-benchmark"
BENCHMARK_CONTEXT = "benchmark"  # the dataset input's context in MLflow
ROLE_TAG = "collapse_guard.role"
_ROLE = "frozen-benchmark"
_ARTIFACT = "benchmark/run_ids.json"
# Share of the dataset set apart: as large as a training's test split (DEFAULT_FRACTIONS),
# so that the champion's test runs are about enough to fill it.
BENCHMARK_SHARE = 0.2


def ids_digest(run_ids: Sequence[str]) -> str:
    """SHA-256 (first 16 hex digits) of the sorted ids: one benchmark, one digest."""
    return hashlib.sha256("\n".join(sorted(run_ids)).encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class FrozenBenchmark:
    """The benchmark's run ids and its MLflow record."""

    run_ids: tuple[str, ...]
    digest: str
    mlflow_run_id: str
    created: bool  # True when this call chose and recorded it

    def dataset(self, source: str | Path):
        """The MLflow dataset that names these runs (logged as an input of each retrain)."""
        import mlflow
        from mlflow.data.sources import LocalArtifactDatasetSource

        frame = pd.DataFrame({"run_id": list(self.run_ids)})
        return mlflow.data.from_pandas(
            frame,
            source=LocalArtifactDatasetSource(str(source)),
            name=BENCHMARK_NAME,
            digest=self.digest,
        )


def choose_benchmark(
    metas: Sequence[RunMeta],
    *,
    exclude: set[str] | frozenset[str] = frozenset(),
    share: float = BENCHMARK_SHARE,
    seed: int = 0,
) -> list[str]:
    """``share`` of the runs (rounded per stratum), never one of ``exclude``.

    Strata: (collapsed?, source). Within each, ids are sorted and shuffled with ``seed``:
    the choice depends only on the runs and the seed. When fewer runs than the share are
    eligible, all of them are taken.
    """
    if not 0 < share < 1:
        raise ValueError(f"share must be a fraction in (0, 1); got {share}")
    eligible = [m for m in metas if m.run_id not in exclude]
    if not eligible:
        return []
    fraction = min(1.0, share * len(metas) / len(eligible))
    strata: dict[tuple[bool, str], list[str]] = defaultdict(list)
    for meta in eligible:
        strata[(meta.onset_step is not None, meta.source)].append(meta.run_id)
    rng = np.random.default_rng(seed)
    chosen: list[str] = []
    for key in sorted(strata):
        ids = sorted(strata[key])
        take = math.floor(len(ids) * fraction + 0.5)
        chosen.extend(ids[i] for i in rng.permutation(len(ids))[:take])
    return sorted(chosen)


def find_benchmark(experiment_id: str) -> FrozenBenchmark | None:
    """The experiment's benchmark (the oldest record), or None when none was recorded."""
    import mlflow

    records = use_store().search_runs(
        [experiment_id],
        filter_string=f"tags.`{ROLE_TAG}` = '{_ROLE}'",
        order_by=["attributes.start_time ASC"],
        max_results=1,
    )
    if not records:
        return None
    run = records[0]
    ids = tuple(mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/{_ARTIFACT}")["run_ids"])
    digests = {d.dataset.digest for d in run.inputs.dataset_inputs}
    if digests != {ids_digest(ids)}:
        raise ValueError(
            f"the frozen benchmark record (MLflow run {run.info.run_id}) is damaged: its ids "
            f"hash to {ids_digest(ids)}, its dataset says {sorted(digests)}; expected one "
            "digest of those ids. Fix: delete that MLflow run; the next retrain records anew"
        )
    return FrozenBenchmark(ids, ids_digest(ids), run.info.run_id, created=False)


def record_benchmark(
    experiment_id: str,
    run_ids: Sequence[str],
    source: str | Path,
    *,
    share: float = BENCHMARK_SHARE,
    seed: int = 0,
) -> FrozenBenchmark:
    """Record ``run_ids`` as the experiment's benchmark (first retrain); returns the oldest
    record, which is this one unless another retrain recorded one first.

    ``source``: the dataset folder, named in the MLflow dataset. ``share`` and ``seed``:
    how the ids were chosen (:func:`choose_benchmark`), logged as params.
    """
    import mlflow

    ids = tuple(sorted(run_ids))
    if not ids:
        raise UserInputError(
            "no run can be set apart as the frozen benchmark: every run in the dataset "
            "folder was trained or validated on by the champion",
            "add run files the champion never saw (--runs)",
        )
    chosen = FrozenBenchmark(ids, ids_digest(ids), "", created=True)
    use_store()  # points mlflow.start_run at the store
    with mlflow.start_run(
        experiment_id=experiment_id, run_name="frozen-benchmark", tags={ROLE_TAG: _ROLE}
    ) as run:
        mlflow.log_input(chosen.dataset(source), context=BENCHMARK_CONTEXT)
        mlflow.log_dict({"run_ids": list(ids), "digest": chosen.digest}, _ARTIFACT)
        mlflow.log_params({"n_runs": len(ids), "share": share, "seed": seed})
    # two first retrains at once both record one: the oldest is the benchmark for both
    oldest = find_benchmark(experiment_id)
    return replace(oldest, created=oldest.mlflow_run_id == run.info.run_id)
