"""Each plot writes a real PNG from plain data (no display, no pyplot), and draws what it
promises: the tests read the figure's artists (lines, bars, cells, labels), as
scikit-learn's Display tests do, through the one ``plots._save`` every plot goes through."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.image import imread
from sklearn.calibration import calibration_curve

from collapse_guard.predictor.evaluate import plots


def _check_png(path, min_kb: float = 8.0, min_px: int = 300) -> None:
    assert path.exists(), path
    assert path.stat().st_size > min_kb * 1024, f"{path.name}: {path.stat().st_size} bytes"
    height, width = imread(path).shape[:2]
    assert height >= min_px and width >= min_px, (width, height)


@pytest.fixture
def drawn(monkeypatch):
    """The figures the plots save, in order (each still written to its path)."""
    figures = []
    save = plots._save

    def keep(fig, path):
        figures.append(fig)
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    return figures


def _labels(ax) -> list[str]:
    return [text.get_text() for text in ax.get_legend().get_texts()]


@pytest.fixture(scope="module")
def scored():
    rng = np.random.default_rng(0)
    y = (rng.random(4000) < 0.1).astype(int)
    p = np.clip(0.7 * y + rng.normal(0.1, 0.15, len(y)), 0, 1)
    return y, p


def test_pr_curve_with_baselines(tmp_path, scored, drawn):
    y, p = scored
    dsi = (p > 0.5).astype(float)  # a binary rule: a two-point curve
    path = plots.pr_curve(y, p, tmp_path / "pr.png", baselines={"dsi": dsi})
    _check_png(path)
    (ax,) = drawn[0].axes
    assert _labels(ax) == ["model", "dsi", "base rate"]
    model, rule, base = ax.get_lines()
    precision, recall = plots._precision_recall(y, p)
    np.testing.assert_array_equal(model.get_xdata(), recall)
    np.testing.assert_array_equal(model.get_ydata(), precision)
    assert model.get_linewidth() > rule.get_linewidth()  # the model drawn heaviest
    assert len(rule.get_xdata()) == 3  # a binary rule: two thresholds and sklearn's end
    assert base.get_ydata()[0] == pytest.approx(y.mean())


def test_reliability_diagram(tmp_path, scored, drawn):
    y, p = scored
    _check_png(plots.reliability_diagram(y, p, tmp_path / "rel.png"))
    ax, hist = drawn[0].axes
    perfect, model = ax.get_lines()
    assert list(perfect.get_xdata()) == [0, 1] == list(perfect.get_ydata())
    # sklearn's quantile bins (ties at 0 merge two of the ten): observed against predicted
    freq, mean_p = calibration_curve(y, p, n_bins=10, strategy="quantile")
    np.testing.assert_array_equal(model.get_xdata(), mean_p)
    np.testing.assert_array_equal(model.get_ydata(), freq)
    assert len(mean_p) == 9
    # every step is counted once in the histogram, on a log axis
    assert sum(bar.get_height() for bar in hist.patches) == len(p)
    assert hist.get_yscale() == "log" and _labels(ax)[1].startswith("model (Brier 0.")


def test_lead_time_histogram_single_and_per_scorer(tmp_path, drawn):
    leads = np.array([15, 40, 80, 120, 150, 190])
    _check_png(plots.lead_time_histogram(leads, tmp_path / "lead.png"))
    per = {"model": leads, "zclip": leads[:2], "dsi": []}
    _check_png(plots.lead_time_histogram(per, tmp_path / "lead2.png"))
    (one,), (many,) = drawn[0].axes, drawn[1].axes
    assert sum(bar.get_height() for bar in one.patches) == 6
    assert _labels(one) == ["model (n=6, median 100)", "10-step minimum"]
    assert _labels(many)[:-1] == ["model (n=6, median 100)", "zclip (n=2, median 28)", "dsi"]
    assert sum(bar.get_height() for bar in many.patches) == 8  # 20 bins a scorer, 6 + 2 + 0


def test_feature_importance(tmp_path, drawn):
    names = [f"signal_{i}__mean" for i in range(60)]
    path = plots.feature_importance(names, np.arange(60.0), tmp_path / "imp.png")
    _check_png(path)
    (ax,) = drawn[0].axes
    widths = [bar.get_width() for bar in ax.patches]
    assert widths == list(np.arange(35.0, 60.0))  # the top 25, the largest at the top
    assert [t.get_text() for t in ax.get_yticklabels()][-1] == "signal_59__mean"
    assert ax.get_title() == "Top 25 features"


def test_baseline_table(tmp_path, drawn):
    table = pd.DataFrame(
        {"recall_at_warn": [0.9, 0.3, np.nan], "median_lead": [80.0, 12.0, np.nan]},
        index=pd.Index(["model", "zclip", "dsi"], name="scorer"),
    )
    path = plots.baseline_table(table, tmp_path / "table.png", title="test")
    _check_png(path, min_kb=4, min_px=150)
    (ax,) = drawn[0].axes
    cells = ax.tables[0].get_celld()
    rows = [[cells[r, c].get_text().get_text() for c in range(3)] for r in range(4)]
    assert rows == [
        ["scorer", "recall_at_warn", "median_lead"],
        ["model", "0.9", "80"],
        ["zclip", "0.3", "12"],
        ["dsi", "—", "—"],
    ]


def test_run_risk_plot_marks_onset_and_alarms(tmp_path, drawn):
    steps = np.arange(1000)
    loss = np.r_[np.linspace(5, 2.5, 800), np.linspace(2.5, 9, 200)]
    frame = pd.DataFrame({"step": steps, "loss": loss, "grad_norm": np.exp(steps / 200.0)})
    risk = pd.Series(np.clip((steps - 600) / 300, 0, 1), index=steps)
    thresholds = {"watch": 0.2, "warn": 0.5, "critical": 0.8}
    path = plots.run_risk_plot(
        frame, risk, tmp_path / "run.png", thresholds=thresholds, onset_step=850, title="r"
    )
    _check_png(path, min_kb=20)
    loss_ax, grad_ax, risk_ax = drawn[0].axes
    assert grad_ax.get_yscale() == "log" and grad_ax.get_ylabel() == "grad_norm"

    def vertical(ax) -> dict[float, str]:  # x of each vertical line -> its colour
        return {
            float(line.get_xdata()[0]): line.get_color()
            for line in ax.get_lines()
            if len(set(line.get_xdata())) == 1 and len(line.get_xdata()) == 2
        }

    # (s - 600) / 300 first reaches 0.2, 0.5 and 0.8 at steps 660, 750 and 840
    alarms = {660.0: "#e0b000", 750.0: "#e07000", 840.0: "#c00000"}
    for ax in (loss_ax, grad_ax, risk_ax):
        assert vertical(ax) == {**alarms, 850.0: "red"}, ax.get_ylabel()
    levels = {
        float(line.get_ydata()[0]): line.get_color()
        for line in risk_ax.get_lines()
        if len(set(line.get_ydata())) == 1 and len(set(line.get_xdata())) == 2
    }
    assert levels == {0.2: "#e0b000", 0.5: "#e07000", 0.8: "#c00000"}
    assert _labels(risk_ax) == ["P(collapse)", "watch 0.2", "warn 0.5", "critical 0.8"]
    assert [t.get_text() for t in loss_ax.texts] == ["onset"] and loss_ax.get_title() == "r"


def _former_precision_recall(y, score):
    # the curve plots drew before scikit-learn: one point per distinct score, highest first
    keep = np.isfinite(score)
    y, score = y[keep].astype(float), score[keep]
    order = np.argsort(-score, kind="stable")
    y, score = y[order], score[order]
    last_of_tie = np.r_[np.flatnonzero(np.diff(score)), len(score) - 1]
    tp = np.cumsum(y)[last_of_tie]
    return tp / (last_of_tie + 1), tp / y.sum()


def test_pr_curve_points_are_the_former_ones(scored):
    """sklearn's precision_recall_curve gives the same points (plus its (recall 0,
    precision 1) end), with ties, a binary rule and unscored steps left out."""
    y, p = scored
    tied = np.round(p, 2)
    unscored = np.where(np.arange(len(p)) % 7 == 0, np.nan, p)
    for score in (p, tied, (p > 0.5).astype(float), unscored):
        precision, recall = plots._precision_recall(y, score)
        former_precision, former_recall = _former_precision_recall(y, score)
        np.testing.assert_allclose(precision[:-1][::-1], former_precision, rtol=1e-12)
        np.testing.assert_allclose(recall[:-1][::-1], former_recall, rtol=1e-12)
        assert (precision[-1], recall[-1]) == (1.0, 0.0)


def test_pr_curve_without_collapses_draws_no_curve(tmp_path):
    y = np.zeros(100, int)
    assert plots._precision_recall(y, np.linspace(0, 1, 100))[0].size == 0
    _check_png(plots.pr_curve(y, np.linspace(0, 1, 100), tmp_path / "pr.png"), min_kb=4)


def test_reliability_diagram_takes_unscored_steps_and_no_steps(tmp_path, scored):
    y, p = scored
    with_nan = np.where(np.arange(len(p)) % 5 == 0, np.nan, p)  # before the first full window
    _check_png(plots.reliability_diagram(y, with_nan, tmp_path / "nan.png"))
    _check_png(plots.reliability_diagram([], [], tmp_path / "empty.png"), min_kb=4)
