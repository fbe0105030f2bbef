"""Figures of a training and of one run: each function takes data and a path, returns the path.

Figures are drawn on a bare ``matplotlib.figure.Figure`` with the Agg canvas, never through
``pyplot``: no global backend or figure registry is touched, so plotting is safe from a
server thread, a Dask worker or a test, and nothing needs a display.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from sklearn.calibration import calibration_curve
from sklearn.metrics import brier_score_loss, precision_recall_curve

from collapse_guard.predictor.core.levels import CRITICAL, WARN, WATCH
from collapse_guard.runfiles.label import HORIZON, MIN_LEAD

__all__ = [
    "baseline_table",
    "feature_importance",
    "lead_time_histogram",
    "pr_curve",
    "reliability_diagram",
    "report_artifacts",
    "run_risk_plot",
    "scorer_table",
]

# Level colours, shared by the run plot's threshold lines and alarm marks.
_LEVEL_COLOURS = {WATCH: "#e0b000", WARN: "#e07000", CRITICAL: "#c00000"}
# Signals drawn under the loss in the run plot when present: the ones that move first.
_KEY_SIGNALS = ("grad_norm", "update_ratio", "attn_logit_max", "output_logit_max", "grad_cv")
_DPI = 110
# Columns of the per-scorer comparison, in the order a reader compares them.
_TABLE_COLUMNS = (
    "recall",
    "median_lead",
    "fa_per_10k",
    "caught",
    "n_collapsed",
    "pr_auc",
    "roc_auc",
    "brier",
)


def _figure(width: float, height: float, rows: int = 1, **kwargs) -> tuple[Figure, list]:
    fig = Figure(figsize=(width, height), dpi=_DPI)
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, 1, squeeze=False, **kwargs)[:, 0]
    return fig, list(axes)


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    return path


def _precision_recall(y: np.ndarray, score: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(precision, recall) at every distinct score, recall falling; empty without positives.

    Steps with no finite score (no opinion yet, a blow-up) are left out of the curve.
    """
    keep = np.isfinite(score)
    y, score = y[keep], score[keep]
    if not np.any(y):  # no collapse to recall: no curve (sklearn would warn and invent one)
        return np.empty(0), np.empty(0)
    precision, recall, _ = precision_recall_curve(y, score)
    return precision, recall


def pr_curve(
    y_true: Sequence[int],
    p: Sequence[float],
    path: str | Path,
    *,
    baselines: Mapping[str, Sequence[float]] | None = None,
    title: str = "Precision-recall on test runs (per step)",
) -> Path:
    """Precision-recall curve of the model's per-step probabilities, baselines' scores beside."""
    y = np.asarray(y_true)
    fig, (ax,) = _figure(6.0, 4.5)
    for name, score in {"model": p, **(baselines or {})}.items():
        precision, recall = _precision_recall(y, np.asarray(score, dtype=float))
        # recall falls along the arrays: "post" holds each precision down to the next
        # lower recall, the steps that average precision sums (as sklearn draws them)
        ax.step(recall, precision, where="post", label=name, lw=2.2 if name == "model" else 1.2)
    ax.axhline(y.mean() if len(y) else 0.0, color="grey", ls=":", lw=1, label="base rate")
    ax.set(xlabel="recall", ylabel="precision", xlim=(0, 1), ylim=(0, 1.02), title=title)
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def reliability_diagram(
    y_true: Sequence[int], p: Sequence[float], path: str | Path, *, bins: int = 10
) -> Path:
    """Observed collapse frequency against predicted probability, and how many steps got which."""
    y = np.asarray(y_true, dtype=float)
    # no opinion yet (NaN, before the first full window) counts as probability 0, as in
    # the evaluation's Brier score (evaluate.events.row_metrics)
    p = np.clip(np.nan_to_num(np.asarray(p, dtype=float), nan=0.0), 0.0, 1.0)
    freq = mean_p = np.empty(0)
    brier = math.nan
    if len(p):
        # Quantile bins: probabilities of a rare event pile up near 0, so equal-width bins
        # would leave the upper range empty and say nothing about it.
        freq, mean_p = calibration_curve(y, p, n_bins=bins, strategy="quantile", pos_label=1)
        brier = float(brier_score_loss(y, p, pos_label=1))
    fig, (ax, hist) = _figure(5.5, 6.0, rows=2, height_ratios=(3, 1), sharex=True)
    ax.plot([0, 1], [0, 1], color="grey", ls=":", lw=1, label="perfect calibration")
    ax.plot(mean_p, freq, "o-", label=f"model (Brier {brier:.4f})")
    ax.set(ylabel="observed frequency", xlim=(0, 1), ylim=(0, 1), title="Reliability")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    hist.hist(p, bins=np.linspace(0, 1, 51), color="#4070c0")
    # a log axis shows the rare high probabilities beside the many low ones (none: no axis)
    hist.set(xlabel="predicted probability", ylabel="steps", yscale="log" if len(p) else "linear")
    return _save(fig, path)


def lead_time_histogram(
    lead_times: Mapping[str, Sequence[float]] | Sequence[float],
    path: str | Path,
    *,
    horizon: int = HORIZON,
    min_lead: int = MIN_LEAD,
) -> Path:
    """Lead times (onset minus first alarm) of caught collapses, per scorer if a mapping."""
    series = lead_times if isinstance(lead_times, Mapping) else {"model": lead_times}
    fig, (ax,) = _figure(6.0, 4.0)
    bins = np.linspace(0, horizon, 21)
    for name, values in series.items():
        values = np.asarray(values, dtype=float)
        label = f"{name} (n={len(values)}, median {np.median(values):.0f})" if len(values) else name
        ax.hist(values, bins=bins, alpha=0.55, label=label)
    ax.axvline(min_lead, color="grey", ls="--", lw=1, label=f"{min_lead}-step minimum")
    ax.set(xlabel="lead time (steps before onset)", ylabel="caught collapses", xlim=(0, horizon))
    ax.set_title("Lead time of caught collapses")
    ax.legend(fontsize=8)
    return _save(fig, path)


def feature_importance(
    names: Sequence[str], importance: Sequence[float], path: str | Path, *, top: int = 25
) -> Path:
    """Horizontal bars of the ``top`` features by importance (LightGBM gain, say)."""
    importance = np.asarray(importance, dtype=float)
    order = np.argsort(-importance, kind="stable")[:top][::-1]
    fig, (ax,) = _figure(7.0, 0.9 + 0.28 * len(order))
    ax.barh([names[i] for i in order], importance[order], color="#4070c0")
    ax.set(xlabel="importance (gain)", title=f"Top {len(order)} features")
    ax.tick_params(axis="y", labelsize=7)
    return _save(fig, path)


def baseline_table(table: pd.DataFrame, path: str | Path, *, title: str = "") -> Path:
    """Render a metrics table (rows: model and baselines) as an image; floats to 3 digits."""
    shown = table.copy()
    for column in shown.columns:
        if pd.api.types.is_float_dtype(shown[column]):
            shown[column] = shown[column].map(lambda v: "—" if pd.isna(v) else f"{v:.3g}")
    shown = shown.astype(str).reset_index()
    fig, (ax,) = _figure(1.4 + 1.25 * len(shown.columns), 0.8 + 0.32 * (len(shown) + 1))
    ax.axis("off")
    cells = ax.table(cellText=shown.values, colLabels=list(shown.columns), loc="center")
    cells.auto_set_font_size(False)
    cells.set_fontsize(7)
    cells.scale(1.0, 1.3)
    if title:
        ax.set_title(title, fontsize=9)
    return _save(fig, path)


def run_risk_plot(
    frame: pd.DataFrame,
    risk: pd.Series,
    path: str | Path,
    *,
    thresholds: Mapping[str, float],
    onset_step: int | None = None,
    title: str = "",
) -> Path:
    """Loss, key signals and risk of one run over steps, with onset and alarm levels marked.

    ``frame`` is a run (``step`` + signal columns), ``risk`` the model's P(collapse) by step.
    Each level's alarms are the steps where the risk first crosses its threshold upward.
    """
    steps = frame["step"].to_numpy()
    signals = [s for s in _KEY_SIGNALS if s in frame and frame[s].notna().any()]
    fig, axes = _figure(9.0, 2.2 * (2 + len(signals)), rows=2 + len(signals), sharex=True)
    loss_ax, *signal_axes, risk_ax = axes
    loss_ax.plot(steps, frame["loss"], lw=0.8, color="black")
    loss_ax.set_ylabel("loss")
    for ax, name in zip(signal_axes, signals, strict=True):
        values = frame[name].to_numpy(dtype=float)
        # Probe-batch signals are measured every 50 steps and NaN between: drawn through
        # the NaNs they would vanish, so plot the measured points, marked when sparse.
        measured = np.isfinite(values)
        sparse = measured.mean() < 0.5
        ax.plot(steps[measured], values[measured], lw=0.8, marker="." if sparse else None, ms=3)
        # Norms and logits span decades before a collapse; a log axis keeps the run readable.
        if np.nanmin(np.abs(values)) > 0 and np.nanmax(values) / np.nanmin(values) > 100:
            ax.set_yscale("log")
        ax.set_ylabel(name, fontsize=8)
    risk_ax.plot(risk.index, risk.to_numpy(), color="#4070c0", lw=1.2, label="P(collapse)")
    above = risk.to_numpy()
    for level, threshold in sorted(thresholds.items(), key=lambda kv: kv[1]):
        colour = _LEVEL_COLOURS.get(level, "grey")
        risk_ax.axhline(threshold, color=colour, ls="--", lw=0.8, label=f"{level} {threshold:.3g}")
        crossed = np.flatnonzero((above[1:] >= threshold) & (above[:-1] < threshold)) + 1
        if len(above) and above[0] >= threshold:
            crossed = np.r_[0, crossed]
        for ax in axes:
            for step in risk.index[crossed]:
                ax.axvline(step, color=colour, lw=0.7, alpha=0.6)
    risk_ax.set(ylabel="risk", ylim=(0, 1), xlabel="step")
    if onset_step is not None:
        for ax in axes:
            ax.axvline(onset_step, color="red", lw=1.6)
        loss_ax.annotate(
            "onset",
            (onset_step, 1.0),
            xycoords=("data", "axes fraction"),
            color="red",
            fontsize=8,
            ha="right",
            va="top",
        )
    risk_ax.legend(fontsize=7, loc="upper left")
    loss_ax.set_title(title or "Run risk")
    return _save(fig, path)


def scorer_table(report, source: str = "all", operating_point: str = "budget") -> pd.DataFrame:
    """One row per scorer (model, then baselines) of an ``EvalReport``, at one source and point."""
    frame = report.to_frame()
    rows = frame[(frame["source"] == source) & (frame["operating_point"] == operating_point)]
    return rows.set_index("scorer")[list(_TABLE_COLUMNS)]


def report_artifacts(model, report, folder: str | Path) -> Path:
    """Every figure and table of a training's evaluation into ``folder``; returns the folder.

    ``model``: the ``RiskModel``; ``report``: its ``EvalReport`` on the test runs. Writes
    ``pr_curve.png``, ``reliability.png``, ``lead_times.png``, ``feature_importance.png``,
    ``baselines.png`` (all sources pooled, at the false-alarm budget), ``evaluation.csv``
    (every scorer, source and operating point) and ``evaluation.json``.
    """
    import json

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rows = report.row_scores
    y = rows["model"]["y"]
    others = {k: v["score"] for k, v in rows.items() if k != "model" and v["score"] is not None}
    pr_curve(y, rows["model"]["score"], folder / "pr_curve.png", baselines=others)
    reliability_diagram(y, rows["model"]["score"], folder / "reliability.png")
    lead_time_histogram(
        report.lead_times,
        folder / "lead_times.png",
        horizon=report.horizon,
        min_lead=report.min_lead,
    )
    booster = model.booster
    feature_importance(
        booster.feature_name(),
        booster.feature_importance("gain"),
        folder / "feature_importance.png",
    )
    budget = f"{report.budget_per_10k:g} false alarm / 10k healthy steps"
    baseline_table(scorer_table(report), folder / "baselines.png", title=f"Test runs at {budget}")
    report.to_frame().to_csv(folder / "evaluation.csv", index=False)
    (folder / "evaluation.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return folder
