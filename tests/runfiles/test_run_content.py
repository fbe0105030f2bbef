"""Run files read for training, evaluation and calibration (``runfiles.records``) as a
hostile writer makes them (issue 31): steps that repeat or go back, a copy under another
run id, a run id twice; each refused in one clear error naming the file, never a traceback
from the label further down."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from collapse_guard.errors import UserInputError
from collapse_guard.runfiles.format import META_KEY, RunMeta
from collapse_guard.runfiles.records import check_steps, content_fingerprint, load_runs
from collapse_guard.runfiles.writer import write_run


def _frame(n: int = 400, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "step": np.arange(n, dtype=np.int64),
            "loss": 3.0 * np.exp(-np.arange(n) / 300) + rng.normal(0, 0.01, n),
            "grad_norm": rng.uniform(0.5, 1.5, n),
        }
    )


def _raw(path, frame: pd.DataFrame, meta: RunMeta):
    """A run file written without the writer's checks (which refuse what these hold)."""
    good = write_run(path, frame.assign(step=np.arange(len(frame))), meta)
    table = pq.read_table(good)
    table = table.set_column(0, "step", pa.array(frame["step"].to_numpy(), type=pa.int64()))
    pq.write_table(table.replace_schema_metadata({META_KEY.encode(): meta.to_json()}), path)
    return path


@pytest.mark.parametrize("source", ["real", "guarded"])  # a guarded run is labelled as read
@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([0, 1, 2, 3, 4, 4, 6], r"row 5 has step 4, which repeats step 4 of row 4"),
        ([0, 1, 2, 3, 4, 3, 6], r"row 5 has step 3, which goes back from step 4 of row 4"),
    ],
)
def test_load_runs_refuses_steps_that_repeat_or_go_back_naming_the_file(
    source, steps, message, tmp_path
):
    frame = _frame()
    frame.loc[: len(steps) - 1, "step"] = steps
    path = _raw(tmp_path / "bad.parquet", frame, RunMeta("bad", source))
    with pytest.raises(
        UserInputError, match=rf"bad\.parquet \(run 'bad'\): steps must .*{message}"
    ):
        load_runs([path])


def test_load_runs_keeps_an_empty_run_and_names_a_run_id_twice_in_one_line(tmp_path):
    # an empty run is no error to load (calibrate refuses it: it has no healthy step)
    empty = write_run(tmp_path / "empty.parquet", _frame().iloc[:0], RunMeta("empty", "real"))
    assert load_runs([empty])[0].n_rows == 0
    first = write_run(tmp_path / "a.parquet", _frame(), RunMeta("same", "real"))
    second = write_run(tmp_path / "b.parquet", _frame(seed=1), RunMeta("same", "real"))
    with pytest.raises(UserInputError, match=r"run id 'same' appears in both .*a\.parquet and"):
        load_runs([first, second])


def test_content_fingerprint_names_what_a_run_holds_not_what_it_is_called(tmp_path):
    frame = _frame()
    a = load_runs([write_run(tmp_path / "a.parquet", frame, RunMeta("a", "real"))])[0]
    b = load_runs(
        [write_run(tmp_path / "b.parquet", frame.assign(event="x"), RunMeta("b", "synthetic"))]
    )[0]
    assert content_fingerprint(a.frame) == content_fingerprint(b.frame)
    # a frame lacking a signal measured it nowhere: as the file's NaN column
    assert content_fingerprint(frame) == content_fingerprint(a.frame)
    # every NaN alike, whatever its bits
    odd_nan = np.frombuffer(np.uint64(0x7FF8000000000001).tobytes(), dtype=np.float64)[0]
    assert content_fingerprint(frame.assign(lr=odd_nan)) == content_fingerprint(frame)
    changed = frame.copy()
    changed.loc[200, "loss"] += 1e-12
    assert content_fingerprint(changed) != content_fingerprint(frame)
    assert content_fingerprint(frame.assign(step=frame["step"] + 1)) != content_fingerprint(frame)
    # the values belong to their signal: the same numbers under another name differ
    swapped = frame.rename(columns={"loss": "lr"})
    assert content_fingerprint(swapped) != content_fingerprint(frame)


def test_check_steps_takes_one_row_and_no_rows_and_names_a_missing_step_column():
    check_steps(_frame().iloc[:0], "x")
    check_steps(_frame().iloc[:1], "x")
    with pytest.raises(UserInputError, match=r"mine: no 'step' column"):
        check_steps(pd.DataFrame({"loss": [1.0]}), "mine")
