"""The frozen benchmark: chosen once (stratified, seeded, never a run the champion saw),
recorded in MLflow as a dataset, found again by every later retrain."""

from __future__ import annotations

import mlflow

from collapse_guard.predictor.lifecycle.benchmark import (
    BENCHMARK_CONTEXT,
    BENCHMARK_NAME,
    choose_benchmark,
    find_benchmark,
    ids_digest,
    record_benchmark,
)
from collapse_guard.predictor.lifecycle.registry import ensure_experiment
from collapse_guard.runfiles import read_meta


def test_choice_is_a_stratified_seeded_share_without_excluded_runs(base_paths):
    metas = [read_meta(p) for p in base_paths]
    chosen = choose_benchmark(metas, seed=0)
    assert len(chosen) == 12  # 20 % of 60
    assert chosen == choose_benchmark(list(reversed(metas)), seed=0)  # order-free
    assert chosen != choose_benchmark(metas, seed=1)
    collapsed = {m.run_id for m in metas if m.onset_step is not None}
    # the share of collapses is kept, stratum by stratum (rounded)
    assert abs(len(collapsed & set(chosen)) - 0.2 * len(collapsed)) <= 1
    exclude = set(chosen[:4]) | {m.run_id for m in metas[:30]}
    again = choose_benchmark(metas, exclude=exclude, seed=0)
    assert not exclude & set(again)
    assert len(again) == 12  # still 20 % of the dataset, drawn from the eligible ones


def test_recorded_once_then_found(store, base_paths):
    experiment = ensure_experiment("benchmark-test")
    assert find_benchmark(experiment) is None
    ids = choose_benchmark([read_meta(p) for p in base_paths], seed=0)
    first = record_benchmark(experiment, ids, base_paths[0].parent)
    assert first.created and first.run_ids == tuple(ids) and first.digest == ids_digest(ids)
    found = find_benchmark(experiment)
    assert found.run_ids == first.run_ids and not found.created
    # a second record (two first retrains at once): the oldest stays the benchmark
    second = record_benchmark(experiment, ids[:3], base_paths[0].parent)
    assert not second.created and second.run_ids == first.run_ids
    run = mlflow.MlflowClient(store).get_run(first.mlflow_run_id)
    (dataset_input,) = run.inputs.dataset_inputs
    assert dataset_input.dataset.name == BENCHMARK_NAME
    assert dataset_input.dataset.digest == first.digest
    assert {t.key: t.value for t in dataset_input.tags}["mlflow.data.context"] == BENCHMARK_CONTEXT
