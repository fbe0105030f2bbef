"""Dataset cards, on run files written here: counts, onset histogram, coverage and the plot;
the pack card by outcome and config value, and the README block it is written to."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from collapse_guard.datasets.cli import card_command
from collapse_guard.datasets.importers.cli import summary_command
from collapse_guard.runfiles.card import (
    CARD_BEGIN,
    CARD_END,
    card_markdown,
    onset_histogram,
    pack_card,
    plot_card,
    summarize,
)
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


# --------------------------------------------------------------------------- the pack card


def _pack_run(folder, index, onset_kind, **config):
    onset = None if onset_kind is None else 40
    meta = RunMeta(
        f"real-s0-{index:05d}",
        "real",
        config=config,
        onset_step=onset,
        label_version="1",
        extra={"onset_kind": onset_kind},
    )
    write_run(folder / f"{meta.run_id}.parquet", pd.DataFrame({"step": range(10)}), meta)


@pytest.fixture
def pack(tmp_path):
    folder = tmp_path / "pack"
    folder.mkdir()
    _pack_run(folder, 0, None, family="gpt", optimizer="adamw", positions="learned")
    _pack_run(folder, 1, "develops", family="gpt", optimizer="lion", positions="learned")
    _pack_run(folder, 2, "sudden", family="drawn", optimizer="lion", positions="alibi")
    _pack_run(folder, 3, "develops", family="drawn", optimizer="adamw", positions="rope")
    _pack_run(folder, 4, None, family="drawn", optimizer="sgd")  # written before positions
    return folder


def test_pack_card_counts_runs_by_outcome_and_config_value(pack):
    card = pack_card(pack, ("family", "positions", "optimizer"))
    assert card.n_runs == 5 and card.sweeps == {"real-s0": 5}
    assert card.outcomes == {"healthy": 2, "develops": 2, "sudden": 1}
    assert card.values("positions") == ["-", "alibi", "learned", "rope"]
    assert card.by[("family", "drawn", "healthy")] == 1
    assert card.by[("family", "drawn", "develops")] == card.by[("family", "drawn", "sudden")] == 1
    assert card.by[("optimizer", "lion", "develops")] == 1
    assert card.bytes == sum(p.stat().st_size for p in pack.glob("*.parquet"))
    text = card_markdown(card)
    assert text.startswith("5 runs (real-s0 5): 3 collapsed (2 develop, 1 sudden), 2 healthy;")
    assert "| key | value | runs | healthy | develops | sudden |" in text
    assert "| family | drawn | 3 | 1 | 1 | 1 |" in text
    assert "| family | gpt | 2 | 1 | 1 | 0 |" in text
    assert "| positions | - | 1 | 1 | 0 | 0 |" in text


def test_data_card_writes_between_the_card_lines_and_keeps_the_rest(pack, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# Pack\nbefore\n{CARD_BEGIN}\nold card\n{CARD_END}\nafter\n")
    app = typer.Typer()
    app.command()(card_command)
    result = CliRunner().invoke(app, [str(pack), "--write", str(readme)])
    assert result.exit_code == 0, result.output
    text = readme.read_text()
    assert text.startswith(f"# Pack\nbefore\n{CARD_BEGIN}\n5 runs (real-s0 5)")
    assert "| optimizer | sgd | 1 | 1 | 0 | 0 |\n" in text  # the command counts CARD_KEYS
    assert text.endswith(f"| precision | - | 5 | 2 | 2 | 1 |\n{CARD_END}\nafter\n")
    assert "old card" not in text
    again = CliRunner().invoke(app, [str(pack), "--write", str(readme)])
    assert again.exit_code == 0 and readme.read_text() == text  # regenerated, not appended


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda tmp: (tmp / "none", None), "no such folder"),
        (lambda tmp: (tmp / "empty", None), "found none"),
        (lambda tmp: (None, tmp / "README.md"), "expected a line"),
    ],
)
def test_data_card_refuses_bad_input_in_one_line(pack, tmp_path, make, says):
    folder, readme = make(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "README.md").write_text("# no card lines\n")
    app = typer.Typer()
    app.command()(card_command)
    args = [str(folder or pack)] + (["--write", str(readme)] if readme else [])
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and says in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
