"""``predict`` and ``evaluate`` on the user's own files: runs that carry no label are labelled
on the fly by the label rule (so lead times show), and a model of the user's own is shown
beside the bundled one."""

from __future__ import annotations

import re

import pytest
from ops_fixtures import trained
from recorded_runs import record_probe_run, write_unlabelled_run
from typer.testing import CliRunner

from collapse_guard.cli import app
from collapse_guard.runfiles import read_meta, read_run
from collapse_guard.runfiles.label import LABEL_VERSION, label_run

runner = CliRunner()
_LABELLED_NOW = f"labelled now by label rule {LABEL_VERSION!r}"


def _said(output: str) -> str:
    return " ".join(output.split())  # rich wraps long lines at 80 columns off a tty


def _row(output: str, level: str) -> list[str]:
    """The cells of ``level``'s row of predict's table."""
    line = next(x for x in output.splitlines() if re.match(rf"\W*{level}\b", x.strip()))
    return [c.strip() for c in re.split(r"[│┃|]", line)[1:-1]]


def _rows(output: str, scorer: str) -> dict[str, list[str]]:
    """The scorer's rows of the first (all sources) table, by operating point."""
    table = output.split("ROC-like")[0]
    rows = (line.split() for line in table.splitlines())
    set_on = {"val", "rule", "test*"}  # the third cell of a scorer's row, never of a title
    return {c[1]: c for c in rows if len(c) > 4 and c[0] == scorer and c[2] in set_on}


def test_predict_labels_a_run_that_carries_no_label(tmp_path):
    path = write_unlabelled_run(tmp_path / "mine.parquet", "mine")
    frame, meta = read_run(path)
    assert (meta.onset_step, meta.label_version) == (None, None)
    # the loss rises 0.02 nats a step from 400; the EWMA (10 steps) lags it, so the smoothed
    # loss is 0.25 nats (the margin) above its best of ~2.05 near 400 + 10 + 0.25 / 0.02
    onset = label_run(frame).onset_step
    assert 415 <= onset <= 430
    result = runner.invoke(app, ["predict", str(path)])
    assert result.exit_code == 0, result.output
    said = _said(result.output)
    assert f"onset: {onset};" in said
    assert f"the run file carries no onset: {_LABELLED_NOW}" in said
    assert "not labelled" not in said
    assert read_meta(path).label_version is None  # predict labels in memory, writes nothing


def test_predict_says_a_healthy_unlabelled_run_is_healthy(tmp_path):
    path = write_unlabelled_run(tmp_path / "calm.parquet", "calm", collapse_at=None)
    result = runner.invoke(app, ["predict", str(path)])
    assert result.exit_code == 0, result.output
    said = _said(result.output)
    assert "onset: none (healthy)" in said and _LABELLED_NOW in said


def test_evaluate_labels_the_runs_that_carry_no_label(tmp_path):
    """One collapse and one healthy run, neither labelled: read as they are, both would be
    healthy (0 collapses, the collapse's alarms false ones); labelled now, the table counts
    one collapse."""
    write_unlabelled_run(tmp_path / "a.parquet", "a")
    write_unlabelled_run(tmp_path / "b.parquet", "b", collapse_at=None, seed=1)
    result = runner.invoke(app, ["evaluate", "--runs", str(tmp_path)])
    assert result.exit_code == 0, result.output
    said = _said(result.output)
    assert f"2 of the 2 runs carry no label (a, b): {_LABELLED_NOW}" in said
    hits = {point: cells[4] for point, cells in _rows(result.output, "model").items()}
    assert len(hits) == 4 and all(hit.endswith("/1") for hit in hits.values()), hits
    assert "reference" not in said  # the bundled model is the one evaluated


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory):
    return record_probe_run(tmp_path_factory.mktemp("probe") / "my-run.parquet", "my-run")


@pytest.mark.slow  # a real tiny GPT trained 360 steps (~15 s), then scored
def test_predict_shows_the_lead_time_on_a_probe_recorded_collapse(probe_run):
    frame, meta = read_run(probe_run)
    assert meta.label_version is None
    onset = label_run(frame).onset_step
    assert onset is not None and onset > 200  # after the re-warm began
    result = runner.invoke(app, ["predict", str(probe_run)])
    assert result.exit_code == 0, result.output
    assert f"onset: {onset};" in _said(result.output)
    # watch: the earliest level; the bundled model sees this re-warm coming (the demo's)
    _, _, first, lead = _row(result.output, "watch")
    assert int(first) < onset and lead == f"{onset - int(first)} steps"


@pytest.fixture
def own_model(tmp_path, tmp_path_factory):
    """The session's model (trained on the ops runs), saved as a folder; its test runs."""
    model, _, splits = trained(tmp_path_factory.getbasetemp())
    return str(model.save(tmp_path / "model")), splits["test"]


def test_evaluate_prints_the_users_model_beside_the_bundled_one(own_model):
    from collapse_guard.predictor import RiskModel
    from collapse_guard.predictor.evaluate import evaluate_runs

    folder, test = own_model
    args = ["evaluate", *(a for r in test for a in ("--runs", str(r.path))), "--model", folder]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    bundled = RiskModel.load()
    assert f"reference: the bundled model {bundled.meta['version']}" in _said(result.output)
    mine, reference = _rows(result.output, "model"), _rows(result.output, "bundled")
    assert set(mine) == set(reference) == {"watch", "warn", "critical", "budget"}
    # the reference row is the bundled model's own evaluation on the same runs
    alone = evaluate_runs(test, bundled).result("model").events
    assert reference["warn"][4] == f"{alone.caught}/{alone.n_collapsed}"
    assert mine["warn"][4].split("/")[1] == str(alone.n_collapsed)  # the same collapses

    without = runner.invoke(app, [*args, "--no-reference"])
    assert without.exit_code == 0, without.output
    assert not _rows(without.output, "bundled") and "reference" not in without.output


def test_evaluate_leaves_the_reference_out_on_runs_the_bundled_model_saw(own_model, tmp_path):
    """A run with the id of one of the bundled model's training runs: its row would
    overstate it, so it is left out, and the evaluation says why."""
    import dataclasses

    from collapse_guard.runfiles.writer import write_run

    folder, test = own_model
    frame, meta = read_run(test[0].path)
    write_run(tmp_path / "own.parquet", frame, dataclasses.replace(meta, run_id="real-s0-00001"))
    paths = [tmp_path / "own.parquet", *(r.path for r in test[1:])]
    result = runner.invoke(
        app, ["evaluate", *(a for p in paths for a in ("--runs", str(p))), "--model", folder]
    )
    assert result.exit_code == 0, result.output
    said = _said(result.output)
    assert f"trained or validated on 1 of these {len(paths)} runs" in said
    assert not _rows(result.output, "bundled")
