"""Runs labelled under an older label rule: refused at load with the command that fixes
them, and ``collapse-guard data relabel`` brings them to the current rule (label_run's)."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from collapse_guard.cli import app
from collapse_guard.datasets.synthetic.generate import generate_synthetic_runs
from collapse_guard.datasets.synthetic.sampler import SamplerConfig
from collapse_guard.errors import UserInputError
from collapse_guard.runfiles.label import LABEL_VERSION, label_run
from collapse_guard.runfiles.reader import read_meta, read_run
from collapse_guard.runfiles.records import load_runs
from collapse_guard.runfiles.writer import write_run

runner = CliRunner()


@pytest.fixture
def old_runs(tmp_path):
    """Four short synthetic runs, then two of them stamped with an older rule's label
    (version "1", onset moved 50 steps earlier than the current rule finds)."""
    folder = tmp_path / "runs"
    paths = generate_synthetic_runs(
        4, folder, seed=3, config=SamplerConfig(min_steps=600, max_steps=700)
    )
    truth = {}
    for path in paths[:2]:
        frame, meta = read_run(path)
        truth[path] = label_run(frame).onset_step
        old_onset = None if meta.onset_step is None else max(0, meta.onset_step - 50)
        old = dataclasses.replace(meta, label_version="1", onset_step=old_onset)
        write_run(path, frame, old)
    return folder, paths, truth


def test_a_run_of_an_older_label_rule_is_refused_with_the_fix(old_runs):
    folder, paths, _ = old_runs
    assert LABEL_VERSION != "1"
    with pytest.raises(UserInputError) as raised:
        load_runs(paths)
    message = str(raised.value)
    assert (
        f"{paths[0]}: labelled under label rule '1', the current rule is {LABEL_VERSION!r}"
        in message
    )
    assert f"collapse-guard data relabel --runs {folder}" in message
    load_runs(paths[2:])  # current runs load
    # through a command: one line, exit code 2
    result = runner.invoke(app, ["evaluate", "--runs", str(folder)])
    assert result.exit_code == 2 and "collapse-guard data relabel" in result.output
    assert "Traceback" not in result.output


def test_relabel_brings_old_runs_to_the_current_rule_in_place(old_runs):
    folder, paths, truth = old_runs
    untouched = paths[2].stat().st_mtime_ns
    dry = runner.invoke(app, ["data", "relabel", "--runs", str(folder), "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "2 run(s) to relabel" in dry.output and read_meta(paths[0]).label_version == "1"

    result = runner.invoke(app, ["data", "relabel", "--runs", str(folder)])
    assert result.exit_code == 0, result.output
    assert "2 run(s) relabelled" in result.output and "2 already current" in result.output
    assert "(1 onset(s) moved)" in result.output  # run 0 collapses at 355, stored as 305
    assert list(truth.values()) == [355, None]
    for path, onset in truth.items():
        meta = read_meta(path)
        assert (meta.label_version, meta.onset_step) == (LABEL_VERSION, onset)
    assert paths[2].stat().st_mtime_ns == untouched  # a current run is not rewritten
    records = load_runs(paths)  # accepted now
    assert len(records) == 4
    again = runner.invoke(app, ["data", "relabel", "--runs", str(folder)])
    assert "0 run(s) relabelled" in again.output and "4 already current" in again.output
