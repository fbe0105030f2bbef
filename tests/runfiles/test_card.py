"""Dataset card: counts, onset histogram, coverage, and the plot, on run files written here."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from collapse_guard.datasets.importers.cli import summary_command
from collapse_guard.runfiles.card import onset_histogram, plot_card, summarize
from collapse_guard.runfiles.format import RunMeta
from collapse_guard.runfiles.writer import write_run


def _run(folder, run_id, source, onset=None, kind=None, spikes=0, n=100, grad=True):
    steps = np.arange(0, n * 10, 10)
    loss = np.linspace(3.0, 2.0, n)
    frame = pd.DataFrame({"step": steps, "loss": loss, "loss_nonfinite": 0.0})
    if grad:
        frame["grad_norm"] = 1.0
    extra = {"collapse_kind": kind, "spikes": [{"start": 1, "peak": 2, "end": 3, "height": 1.0}]}
    extra["spikes"] *= spikes
    meta = RunMeta(run_id, source, onset_step=onset, label_version="1", extra=extra)
    write_run(folder / f"{run_id}.parquet", frame, meta)


@pytest.fixture
def runs(tmp_path):
    _run(tmp_path, "a", "synthetic", onset=300, kind="loss_rise")
    _run(tmp_path, "b", "synthetic", onset=500, kind="nonfinite", spikes=1)
    _run(tmp_path, "c", "synthetic", spikes=2)
    _run(tmp_path / "sub", "d", "imported", n=50, grad=False)
    return tmp_path


def test_summarize_counts(runs):
    card = summarize(runs)
    assert card.n_runs == 4 and card.n_rows == 350
    assert card.outcomes[("synthetic", "collapsed: loss_rise")] == 1
    assert card.outcomes[("synthetic", "collapsed: nonfinite")] == 1
    assert card.outcomes[("synthetic", "healthy")] == 1
    assert card.outcomes[("imported", "healthy")] == 1
    assert sorted(card.onsets) == [300, 500]
    assert card.spikes["synthetic"] == 3 and card.runs_with_spikes["synthetic"] == 2
    coverage = card.coverage()
    assert coverage["loss"] == 1.0
    assert coverage["grad_norm"] == pytest.approx(300 / 350)
    assert coverage["attn_kl"] == 0.0
    assert sorted(card.rows) == [50, 100, 100, 100] and max(card.spans) == 991


def test_onset_histogram_text():
    lines = onset_histogram([100, 120, 900], bins=2, width=10)
    assert len(lines) == 2 and lines[0].endswith("█" * 10 + " 2") and lines[1].endswith(" 1")
    assert onset_histogram([]) == ["(no collapses)"]


def test_plot_is_a_png(runs, tmp_path):
    path = plot_card(summarize(runs), tmp_path / "out" / "card.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_summary_prints_card_and_writes_plot(runs):
    app = typer.Typer()
    app.command()(summary_command)
    result = CliRunner().invoke(app, [str(runs)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for expected in ("Runs by source and outcome", "Onset step histogram", "Signal coverage"):
        assert expected in text
    assert (runs / "summary.png").is_file()
    empty = CliRunner().invoke(app, [str(runs / "sub" / "nothing")])
    assert empty.exit_code == 2
