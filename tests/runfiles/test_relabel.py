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


def test_relabel_labels_the_runs_recorded_without_a_label(tmp_path):
    """A run the probe recorded (no label in its file) is labelled by the same rule, in
    place; a raw guarded run is left to its censoring, which labels it at every read."""
    from recorded_runs import write_unlabelled_run

    from collapse_guard.runfiles.format import RunMeta

    folder = tmp_path / "mine"
    mine = write_unlabelled_run(folder / "mine.parquet", "mine")
    calm = write_unlabelled_run(folder / "calm.parquet", "calm", collapse_at=None, seed=1)
    frame, _ = read_run(calm)
    guarded = write_run(folder / "guarded.parquet", frame, RunMeta("g", "guarded"))
    onset = label_run(read_run(mine)[0]).onset_step  # test_own_runs derives it: ~423
    assert onset is not None

    dry = runner.invoke(app, ["data", "relabel", "--runs", str(folder), "--dry-run"])
    assert dry.exit_code == 0, dry.output
    said = " ".join(dry.output.split())
    assert f"would label {mine}: onset {onset}" in said and f"would label {calm}: healthy" in said
    assert "2 unlabelled run(s) to label" in said and read_meta(mine).label_version is None

    result = runner.invoke(app, ["data", "relabel", "--runs", str(folder)])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "0 run(s) relabelled (0 onset(s) moved) and 2 unlabelled run(s) labelled" in said
    assert f"by label rule {LABEL_VERSION!r}" in said
    assert "1 raw guarded or without a loss left as they are" in said
    assert (read_meta(mine).label_version, read_meta(mine).onset_step) == (LABEL_VERSION, onset)
    assert (read_meta(calm).label_version, read_meta(calm).onset_step) == (LABEL_VERSION, None)
    assert read_meta(mine).extra["collapse_kind"] == "loss_rise"
    assert read_meta(guarded).label_version is None
    again = runner.invoke(app, ["data", "relabel", "--runs", str(folder)])
    assert "2 already current" in " ".join(again.output.split())


def test_a_run_without_a_loss_is_left_unlabelled(tmp_path):
    """The rule reads the loss: without one it would call any run healthy."""
    from collapse_guard.runfiles.format import RunMeta
    from collapse_guard.runfiles.relabel import relabel_runs
    from collapse_guard.runfiles.writer import RunWriter

    path = tmp_path / "no-loss.parquet"
    with RunWriter(path, RunMeta("no-loss", "imported")) as writer:
        for step in range(100):
            writer.append(step, {"grad_norm": 1.0})
    report = relabel_runs([path])
    assert report.skipped == [path] and not report.labelled
    assert read_meta(path).label_version is None


def test_relabel_keeps_a_compact_file_compact(old_runs):
    from collapse_guard.runfiles.writer import is_compact

    folder, paths, _ = old_runs
    frame, meta = read_run(paths[0])
    write_run(paths[0], frame, meta, compact=True)
    result = runner.invoke(app, ["data", "relabel", "--runs", str(folder)])
    assert result.exit_code == 0, result.output
    assert read_meta(paths[0]).label_version == LABEL_VERSION
    assert is_compact(paths[0]) and not is_compact(paths[1])
