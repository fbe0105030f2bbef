"""Run-level splits never leak a run; training rows stop before onset."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from collapse_guard.errors import UserInputError
from collapse_guard.features import FeatureExtractor
from collapse_guard.features.rises import frame_in_lr_rise
from collapse_guard.predictor.training.data import (
    build_training_data,
    healthy_rise_weights,
    near_positives,
    split_runs,
)
from collapse_guard.runfiles import RunMeta, write_run
from collapse_guard.runfiles.label import HORIZON, LabelRule, collapse_targets
from collapse_guard.runfiles.records import RunRecord, data_fingerprint, find_run_files, load_runs


def _metas(n=90):
    sources = ["synthetic", "real", "imported"]
    return [
        RunMeta(
            run_id=f"r{i:03d}",
            source=sources[i % 3],
            onset_step=(500 + i) if i % 2 else None,
        )
        for i in range(n)
    ]


def test_split_is_by_run_disjoint_complete_and_stratified():
    metas = _metas()
    split = split_runs(metas, seed=0)
    parts = [set(split.train), set(split.validation), set(split.test)]
    assert not (parts[0] & parts[1] or parts[0] & parts[2] or parts[1] & parts[2])
    assert set().union(*parts) == {m.run_id for m in metas}
    by_id = {m.run_id: m for m in metas}
    for part in parts:  # every split sees each outcome from each source
        strata = {(by_id[r].onset_step is not None, by_id[r].source) for r in part}
        assert len(strata) == 6
    assert len(split.train) == 54 and len(split.validation) == len(split.test) == 18


def test_split_depends_on_seed_not_on_order():
    metas = _metas()
    a = split_runs(metas, seed=1)
    assert split_runs(list(reversed(metas)), seed=1) == a
    assert split_runs(metas, seed=2) != a


def test_split_rejects_duplicates_and_bad_fractions():
    metas = _metas(6)
    with pytest.raises(ValueError, match="duplicated: r000"):
        split_runs([*metas, metas[0]])
    with pytest.raises(ValueError, match="summing to 1"):
        split_runs(metas, fractions=(0.5, 0.5, 0.5))


def test_rows_stop_before_onset_and_no_test_window_is_trained_on(run_records):
    split = split_runs([r.meta for r in run_records], seed=0)
    train_runs = [r for r in run_records if r.run_id in split.train]
    data = build_training_data(train_runs, FeatureExtractor(), stride=10)
    assert set(data.groups) <= set(split.train)
    assert not set(data.groups) & (set(split.validation) | set(split.test))
    onsets = {r.run_id: r.meta.onset_step for r in run_records}
    for run_id in set(data.groups):
        rows = data.groups == run_id
        steps = data.steps[rows]
        onset = onsets[run_id]
        if onset is not None:
            assert steps.max() < onset  # nothing at or after onset
        y, _ = collapse_targets(steps, onset)
        np.testing.assert_array_equal(data.y[rows], y)
        assert np.all(np.diff(steps) >= 10)  # every 10th recorded step
    assert data.y.sum() > 0 and list(data.X.columns) == list(FeatureExtractor().schema.names)
    assert set(data.source) == {"synthetic"}


def test_a_sudden_collapse_gives_no_positive_rows_and_one_that_develops_does(run_records):
    collapsed = max(run_records, key=lambda r: r.meta.onset_step or 0)
    onset = collapsed.meta.onset_step
    assert onset > HORIZON + 100  # rows before onset - H exist to keep
    as_kind = {
        kind: RunRecord(collapsed.frame, replace(collapsed.meta, extra={"onset_kind": kind}))
        for kind in ("develops", "sudden")
    }
    develops = build_training_data([as_kind["develops"]], FeatureExtractor(), stride=10)
    sudden = build_training_data([as_kind["sudden"]], FeatureExtractor(), stride=10)
    assert develops.y.sum() >= 15  # ~20 rows in the last 200 steps at stride 10
    # the sudden one: the same early rows, healthy, and nothing of its last H steps
    assert sudden.y.sum() == 0 and sudden.steps.max() < onset - HORIZON
    early = develops.steps < onset - HORIZON
    np.testing.assert_array_equal(sudden.steps, develops.steps[early])
    pd.testing.assert_frame_equal(sudden.X, develops.X[early].reset_index(drop=True))


def test_a_collapse_trains_as_positives_only_its_rows_near_the_onset(run_records):
    data = build_training_data(run_records, FeatureExtractor(), stride=10)
    onsets = {r.run_id: r.meta.onset_step for r in run_records}
    ahead = np.array(
        [(onsets[g] or 10**9) - s for g, s in zip(data.groups, data.steps, strict=True)]
    )
    near = near_positives(data, run_records, 60)
    # the healthy rows all kept, in order; the positives 61-200 steps ahead left out
    assert (near.y == 0).sum() == (data.y == 0).sum()
    far = (data.y == 1) & (ahead > 60)
    assert far.sum() >= 100 and len(near) == len(data) - far.sum()
    assert near.y.sum() == ((data.y == 1) & (ahead <= 60)).sum() > 0
    kept = ~far
    np.testing.assert_array_equal(near.steps, data.steps[kept])
    pd.testing.assert_frame_equal(near.X, data.X[kept].reset_index(drop=True))
    assert near_positives(data, run_records, None) is data  # every row of the horizon


def test_each_row_knows_whether_its_step_lies_in_an_lr_rise(run_records):
    data = build_training_data(run_records, FeatureExtractor(), stride=10)
    for run in run_records[:6]:
        rise = frame_in_lr_rise(run.frame)
        mine = data.groups == run.run_id
        at = np.searchsorted(run.frame["step"].to_numpy(), data.steps[mine])
        np.testing.assert_array_equal(data.in_rise[mine], rise[at])
    # the warm-up is a rise and the runs go on past it: rows of both kinds
    assert 0.05 < data.in_rise.mean() < 0.95
    onsets = {r.run_id: r.meta.onset_step for r in run_records}
    ahead = np.array(
        [(onsets[g] or 10**9) - s for g, s in zip(data.groups, data.steps, strict=True)]
    )
    kept = (data.y == 0) | (ahead <= 60)
    near = near_positives(data, run_records, 60)  # kept along with the rows
    np.testing.assert_array_equal(near.in_rise, data.in_rise[kept])


def test_the_healthy_rows_inside_a_rise_weigh_what_is_asked_and_the_rest_one(run_records):
    data = build_training_data(run_records, FeatureExtractor(), stride=10)
    assert healthy_rise_weights(data, 1.0) is None  # an unweighted fit
    weights = healthy_rise_weights(data, 3.0)
    hard = (data.y == 0) & data.in_rise
    assert hard.sum() > 0 and ((data.y == 1) & data.in_rise).sum() > 0
    np.testing.assert_array_equal(weights[hard], 3.0)
    np.testing.assert_array_equal(weights[~hard], 1.0)


def test_fingerprint_ignores_order_but_not_labels_or_lengths():
    frame = pd.DataFrame({"step": np.arange(5)})
    runs = [RunRecord(frame, m) for m in _metas(10)]
    assert data_fingerprint(runs) == data_fingerprint(reversed(runs))
    relabelled = RunMeta(run_id="r009", source="imported", onset_step=1)
    changed = [*runs[:-1], RunRecord(frame, relabelled)]
    assert data_fingerprint(changed) != data_fingerprint(runs)
    regrown = [*runs[:-1], RunRecord(pd.DataFrame({"step": np.arange(6)}), runs[-1].meta)]
    assert data_fingerprint(regrown) != data_fingerprint(runs)


def test_find_run_files_sorts_dedupes_and_refuses_empty_or_missing(tmp_path, synthetic_paths):
    folder = synthetic_paths[0].parent
    found = find_run_files([folder, synthetic_paths[0]])
    assert found == sorted(synthetic_paths) and len(found) == len(synthetic_paths)
    # bad input, not a bug: the command prints it as one line (exit code 2)
    with pytest.raises(UserInputError, match="no runs found under"):
        find_run_files([tmp_path])
    with pytest.raises(UserInputError, match="does not exist: expected a folder"):
        find_run_files([tmp_path / "nope"])


def test_a_raw_guarded_run_is_censored_when_loaded(tmp_path):
    # the guard writes its runs unlabelled: read raw, all 1,500 rows would train as healthy,
    # also those after the LR cut at step 900 that may have averted a collapse
    steps = np.arange(1500)
    loss = 2.4 + 3.0 * np.exp(-steps / 200)
    events = ["lr_x0.5" if s == 900 else "" for s in steps]
    frame = pd.DataFrame({"step": steps, "loss": loss, "event": events})
    path = tmp_path / "guarded.parquet"
    write_run(path, frame, RunMeta(run_id="g", source="guarded", extra={"guard": {}}))
    (run,) = load_runs([path])
    assert run.frame["step"].max() == 900 - LabelRule().tail_min_steps - HORIZON - 1
    assert run.meta.label_version is not None and run.meta.extra["censoring"]["rows_before"] == 1500
    plain = tmp_path / "plain.parquet"
    write_run(plain, frame, RunMeta(run_id="p", source="real"))
    assert len(load_runs([plain])[0].frame) == 1500  # only guarded runs are censored


def test_a_stored_run_holds_no_frame_and_reads_the_one_load_checked(tmp_path, synthetic_paths):
    # a training of 10,000 runs held 4.4 GB of frames: stored records hold their metadata
    from collapse_guard.runfiles import read_run

    (held,) = load_runs(synthetic_paths[:1])
    (stored,) = load_runs(synthetic_paths[:1], lazy=True)
    assert stored._frame is None and stored.n_rows == held.n_rows == len(held.frame)
    pd.testing.assert_frame_equal(stored.frame, held.frame)
    assert stored.held._frame is not None and held.held is held
    assert data_fingerprint([stored]) == data_fingerprint([held])
    fx = FeatureExtractor(window=50)
    pd.testing.assert_frame_equal(
        build_training_data([stored], fx).X, build_training_data([held], fx).X
    )
    # a raw guarded run: censored at each read as at load
    frame, _ = read_run(synthetic_paths[1])
    guarded = write_run(tmp_path / "g.parquet", frame, RunMeta(run_id="g", source="guarded"))
    (raw,) = load_runs([guarded], lazy=True)
    assert raw.meta.label_version is not None and len(raw.frame) == raw.n_rows


def test_training_rows_are_held_once_not_twice_while_built(run_records):
    # the rows used to be a list of per-run frames, then their concatenation: twice the
    # rows at the peak (at 10,000 synthetic runs, 3.3 GB more)
    import tracemalloc

    fx = FeatureExtractor(window=100)
    runs = run_records[:40]
    tracemalloc.start()
    try:
        data = build_training_data(runs, fx, stride=5)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    rows = data.X.to_numpy().nbytes
    # the array is sized for every stride-th row (an upper bound: rows after onset drop)
    capacity = sum(-(-r.n_rows // 5) for r in runs) * data.X.shape[1] * 8
    assert rows > 5e6 and capacity < 1.3 * rows and peak < 1.2 * capacity, (peak, rows)
    # the rows the run-by-run path (Dask's workers) gives, in the same order
    from collapse_guard.predictor.training.data import concat_rows, run_rows

    parts = [run_rows(r, fx, stride=5, horizon=HORIZON) for r in runs]
    pieces = concat_rows([p for p in parts if p is not None], len(runs))
    pd.testing.assert_frame_equal(pieces.X, data.X)
    assert (pieces.groups == data.groups).all() and (pieces.steps == data.steps).all()
