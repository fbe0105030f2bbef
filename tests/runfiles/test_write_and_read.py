"""Run files (format, writer, reader): round trip, version and damage checks, writer
contract, crash durability.

Cost of durability (measured on the shared 2-core machine, loaded): a 20,000-step
run with all 28 signal columns and ``chunk_steps=256`` (79 atomic rewrites) takes
about 3.2 s to write in all, of which about 2.7 s (135 us a step) is the price of
rewriting + fsync per chunk versus one single write at the end.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from collapse_guard.runfiles.format import (
    META_KEY,
    RUN_COLUMNS,
    SCHEMA_VERSION,
    RunFileError,
    RunMeta,
    SchemaVersionError,
)
from collapse_guard.runfiles.reader import list_runs, read_meta, read_run
from collapse_guard.runfiles.writer import RunWriter, write_run
from collapse_guard.signals import SIGNAL_NAMES


def _meta(**kw) -> RunMeta:
    return RunMeta(run_id="t1", source="real", config={"lr": 0.05, "layers": 2}, **kw)


def test_round_trip_keeps_nan_inf_events_and_metadata(tmp_path):
    path = tmp_path / "run.parquet"
    rows = [
        (0, {"loss": 3.0, "grad_norm": 1.5, "lr": 1e-3}, ""),
        (1, {"loss": math.inf, "loss_nonfinite": 1.0, "grad_norm": -math.inf}, "skip_batch"),
        (5, {"loss": math.nan, "loss_nonfinite": 1.0, "attn_kl": 0.3}, ""),
        (7, {}, "rollback"),
    ]
    with RunWriter(path, _meta(), chunk_steps=2) as writer:
        for step, record, event in rows:
            writer.append(step, record, event)
    frame, meta = read_run(path)

    assert tuple(frame.columns) == RUN_COLUMNS
    assert frame["step"].dtype == np.int64
    assert all(frame[name].dtype == np.float64 for name in SIGNAL_NAMES)
    assert frame["step"].tolist() == [0, 1, 5, 7]
    assert frame["event"].tolist() == ["", "skip_batch", "", "rollback"]
    assert frame.loc[1, "loss"] == math.inf and frame.loc[1, "grad_norm"] == -math.inf
    assert math.isnan(frame.loc[2, "loss"]) and frame.loc[2, "loss_nonfinite"] == 1.0
    assert frame.loc[2, "attn_kl"] == 0.3
    assert frame.iloc[3][list(SIGNAL_NAMES)].isna().all()  # nothing measured: all NaN
    assert meta == _meta()
    assert read_meta(path) == meta


def test_close_sets_final_metadata_and_is_idempotent(tmp_path):
    path = tmp_path / "run.parquet"
    writer = RunWriter(path, _meta(extra={"fault": "lr_jump"}))
    writer.append(0, {"loss": 1.0})
    assert writer.close(onset_step=0, label_version="1", extra={"collapse_kind": "x"}) == path
    mtime = path.stat().st_mtime_ns
    assert writer.close() == path  # second close: nothing to do, nothing rewritten
    assert path.stat().st_mtime_ns == mtime
    meta = read_meta(path)
    assert (meta.onset_step, meta.label_version) == (0, "1")
    assert meta.extra == {"fault": "lr_jump", "collapse_kind": "x"}  # extra is merged
    assert writer.rows_written == 1
    with pytest.raises(RunFileError, match="append after close"):
        writer.append(1, {"loss": 1.0})


def test_metadata_changed_before_close_is_durable_at_the_next_flush(tmp_path):
    # a resumed guard's lineage: on disk with the first chunk, not only at close
    path = tmp_path / "run.parquet"
    writer = RunWriter(path, _meta(extra={"fault": "x"}), chunk_steps=1000)
    writer.update_meta(extra={"continues": {"run_id": "t0", "step": 3}})
    writer.append(3, {"loss": 1.0})
    writer.flush()
    assert read_meta(path).extra == {"fault": "x", "continues": {"run_id": "t0", "step": 3}}
    writer.update_meta(onset_step=3)
    writer.flush()  # no new row: the metadata alone is rewritten
    assert read_meta(path).onset_step == 3 and writer.rows_written == 1
    with pytest.raises(RunFileError, match="onset"):
        writer.update_meta(onset=3)  # unknown field: named
    writer.close()


def test_empty_run_is_a_valid_file(tmp_path):
    path = RunWriter(tmp_path / "empty.parquet", _meta()).close()
    frame, _ = read_run(path)
    assert len(frame) == 0 and tuple(frame.columns) == RUN_COLUMNS


def test_unknown_key_in_append_lists_known_names(tmp_path):
    writer = RunWriter(tmp_path / "run.parquet", _meta())
    with pytest.raises(RunFileError, match=r"unknown signal name.*'gradnorm'.*grad_norm"):
        writer.append(0, {"loss": 1.0, "gradnorm": 2.0})
    with pytest.raises(RunFileError, match="must be a number"):
        writer.append(0, {"loss": "high"})
    writer.append(0, {"loss": 1.0})  # the failed appends left nothing half-written
    with pytest.raises(RunFileError, match="strictly increase"):
        writer.append(0, {"loss": 1.0})
    writer.close()
    assert len(read_run(writer.path)[0]) == 1


def test_unknown_schema_version_names_file_and_both_versions(tmp_path):
    path = tmp_path / "future.parquet"
    write_run(path, pd.DataFrame({"step": [0], "loss": [1.0]}), _meta(schema_version=99))
    with pytest.raises(SchemaVersionError) as info:
        read_run(path)
    message = str(info.value)
    assert str(path) in message and "99" in message and str(SCHEMA_VERSION) in message
    with pytest.raises(SchemaVersionError):
        read_meta(path)


@pytest.mark.parametrize("keep", [0, 10, 0.5, -20])
def test_truncated_file_is_a_run_file_error(tmp_path, keep):
    path = tmp_path / "run.parquet"
    frame = pd.DataFrame({"step": np.arange(500), "loss": np.linspace(3, 2, 500)})
    write_run(path, frame, _meta())
    data = path.read_bytes()
    cut = int(len(data) * keep) if isinstance(keep, float) else keep % len(data)
    path.write_bytes(data[:cut])
    with pytest.raises(RunFileError, match=str(path.name)):
        read_run(path)


def test_parquet_without_our_metadata_is_rejected(tmp_path):
    path = tmp_path / "foreign.parquet"
    pq.write_table(pa.table({"step": [1, 2]}), path)
    with pytest.raises(RunFileError, match="not a collapse-guard run file"):
        read_run(path)


def test_missing_signal_columns_come_back_as_nan(tmp_path):
    # An older or partial writer: only step, loss and a metadata blob.
    path = tmp_path / "old.parquet"
    table = pa.table({"step": pa.array([3, 4], pa.int64()), "loss": [2.0, 2.1]})
    table = table.replace_schema_metadata({META_KEY: _meta().to_json()})
    pq.write_table(table, path)
    frame, _ = read_run(path)
    assert tuple(frame.columns) == RUN_COLUMNS
    assert frame["loss"].tolist() == [2.0, 2.1]
    assert frame["grad_norm"].isna().all() and frame["event"].tolist() == ["", ""]


def test_write_run_validates_frames(tmp_path):
    path = tmp_path / "run.parquet"
    with pytest.raises(RunFileError, match="unknown column"):
        write_run(path, pd.DataFrame({"step": [0], "los": [1.0]}), _meta())
    with pytest.raises(RunFileError, match="strictly increase"):
        write_run(path, pd.DataFrame({"step": [0, 2, 1]}), _meta())
    with pytest.raises(ValueError, match="source must be one of"):
        RunMeta(run_id="x", source="simulated")


def test_list_runs_recurses_and_skips_temp_files(tmp_path):
    for name in ("b/2.parquet", "a.parquet", "b/.2.parquet.tmp-7"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    assert list_runs(tmp_path) == [tmp_path / "a.parquet", tmp_path / "b/2.parquet"]


_CHILD = textwrap.dedent(
    """
    import sys
    from collapse_guard.runfiles.format import RunMeta
    from collapse_guard.runfiles.writer import RunWriter
    path, chunk = sys.argv[1], int(sys.argv[2])
    writer = RunWriter(path, RunMeta(run_id="killed", source="real"), chunk_steps=chunk)
    flushed, step = 0, 0
    while True:  # never ends by itself: the parent kills it mid-run
        writer.append(step, {"loss": 3.0 - step * 1e-4, "grad_norm": 1.0})
        step += 1
        if writer.rows_written != flushed:
            flushed = writer.rows_written
            print(flushed, flush=True)
    """
)


def test_sigkill_mid_run_keeps_every_finished_chunk(tmp_path):
    path, chunk = tmp_path / "run.parquet", 50
    env = {**os.environ, "OMP_WAIT_POLICY": "passive"}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path), str(chunk)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    reported = 0
    deadline = time.monotonic() + 60
    try:
        while reported < 6 * chunk and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            reported = int(line)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        child.stdout.close()
    assert reported >= 6 * chunk, f"child reported only {reported} rows flushed"
    frame, meta = read_run(path)
    assert len(frame) % chunk == 0
    assert len(frame) >= reported
    assert frame["step"].tolist() == list(range(len(frame)))
    assert meta.run_id == "killed"
