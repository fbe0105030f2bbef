"""Each plot writes a real, non-trivial PNG from plain data (no display, no pyplot)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.image import imread

from collapse_guard.predictor.evaluate import plots


def _check_png(path, min_kb: float = 8.0, min_px: int = 300) -> None:
    assert path.exists(), path
    assert path.stat().st_size > min_kb * 1024, f"{path.name}: {path.stat().st_size} bytes"
    height, width = imread(path).shape[:2]
    assert height >= min_px and width >= min_px, (width, height)


@pytest.fixture(scope="module")
def scored():
    rng = np.random.default_rng(0)
    y = (rng.random(4000) < 0.1).astype(int)
    p = np.clip(0.7 * y + rng.normal(0.1, 0.15, len(y)), 0, 1)
    return y, p


def test_pr_curve_with_baselines(tmp_path, scored):
    y, p = scored
    dsi = (p > 0.5).astype(float)  # a binary rule: a two-point curve
    path = plots.pr_curve(y, p, tmp_path / "pr.png", baselines={"dsi": dsi})
    _check_png(path)


def test_reliability_diagram(tmp_path, scored):
    _check_png(plots.reliability_diagram(*scored, tmp_path / "rel.png"))


def test_lead_time_histogram_single_and_per_scorer(tmp_path):
    leads = np.array([15, 40, 80, 120, 150, 190])
    _check_png(plots.lead_time_histogram(leads, tmp_path / "lead.png"))
    per = {"model": leads, "zclip": leads[:2], "dsi": []}
    _check_png(plots.lead_time_histogram(per, tmp_path / "lead2.png"))


def test_feature_importance(tmp_path):
    names = [f"signal_{i}__mean" for i in range(60)]
    path = plots.feature_importance(names, np.arange(60.0), tmp_path / "imp.png")
    _check_png(path)


def test_baseline_table(tmp_path):
    table = pd.DataFrame(
        {"recall_at_warn": [0.9, 0.3, np.nan], "median_lead": [80.0, 12.0, np.nan]},
        index=pd.Index(["model", "zclip", "dsi"], name="scorer"),
    )
    path = plots.baseline_table(table, tmp_path / "table.png", title="test")
    _check_png(path, min_kb=4, min_px=150)


def test_run_risk_plot_marks_onset_and_alarms(tmp_path):
    steps = np.arange(1000)
    loss = np.r_[np.linspace(5, 2.5, 800), np.linspace(2.5, 9, 200)]
    frame = pd.DataFrame({"step": steps, "loss": loss, "grad_norm": np.exp(steps / 200.0)})
    risk = pd.Series(np.clip((steps - 600) / 300, 0, 1), index=steps)
    thresholds = {"watch": 0.2, "warn": 0.5, "critical": 0.8}
    path = plots.run_risk_plot(
        frame, risk, tmp_path / "run.png", thresholds=thresholds, onset_step=850, title="r"
    )
    _check_png(path, min_kb=20)


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
