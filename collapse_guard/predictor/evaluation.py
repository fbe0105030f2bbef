"""Event-level evaluation, as a user lives it (DESIGN.md "Predictor").

Every scorer (the model or a baseline) gives a score at *every* step of each test
run; a threshold turns scores into alarms, and consecutive alarmed steps are one
alarm episode. Then, with H the horizon:

- a collapse is *caught* when the first alarmed step in the H steps before onset,
  [onset - H, onset), comes at least ``min_lead`` (10) steps before onset. An episode
  already running when that stretch begins counts from its first step inside it: the
  user is being warned then;
- its *lead time* is onset minus that first alarmed step;
- a *false alarm* is an episode that starts on a healthy run, or on a collapsing run
  earlier than H steps before onset; *healthy steps* are those steps;
- *recall at budget* uses the lowest threshold (per scorer) at which false alarms per
  10,000 healthy steps of the evaluated runs stay within the budget, so every scorer is
  compared at the same false-alarm rate; the model is also reported at its stored
  level thresholds (set on validation runs: the figure a user gets) and each baseline
  at its native rule.

Row-level metrics over every step before onset: PR-AUC (average precision), ROC-AUC,
and the Brier score for scorers that give probabilities.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from sklearn.metrics import average_precision_score, roc_auc_score

from collapse_guard.datasets.label import HORIZON, collapse_targets
from collapse_guard.predictor.levels import alarm_starts, threshold_for_episodes

__all__ = [
    "MIN_LEAD",
    "EvalReport",
    "ScoredRun",
    "evaluate_runs",
    "event_metrics",
    "healthy_sequences",
    "row_metrics",
    "threshold_at_budget",
]

MIN_LEAD = 10  # steps: an alarm later than this before onset leaves no time to act

_RESULT_COLUMNS = (
    "scorer",
    "source",
    "operating_point",
    "threshold",
    "n_runs",
    "n_collapsed",
    "caught",
    "recall",
    "median_lead",
    "false_alarms",
    "healthy_steps",
    "fa_per_10k",
    "pr_auc",
    "roc_auc",
    "brier",
)


@dataclass(frozen=True)
class ScoredRun:
    """One run's per-step scores from one scorer."""

    run_id: str
    source: str
    steps: np.ndarray
    scores: np.ndarray
    onset_step: int | None


def _pre_onset(run: ScoredRun) -> tuple[np.ndarray, np.ndarray]:
    if run.onset_step is None:
        return run.steps, run.scores
    keep = run.steps < run.onset_step
    return run.steps[keep], run.scores[keep]


def healthy_sequences(runs: Sequence[ScoredRun], horizon: int = HORIZON) -> list[np.ndarray]:
    """Scores at healthy steps: all of a healthy run, and a collapsing run before onset - H."""
    out = []
    for run in runs:
        if run.onset_step is None:
            out.append(np.asarray(run.scores, dtype=np.float64))
        else:
            out.append(np.asarray(run.scores[run.steps < run.onset_step - horizon], np.float64))
    return out


def threshold_at_budget(
    runs: Sequence[ScoredRun], budget_per_10k: float = 1.0, horizon: int = HORIZON
) -> float:
    """Lowest threshold with <= budget_per_10k false alarms per 10,000 healthy steps."""
    seqs = healthy_sequences(runs, horizon)
    healthy = sum(s.size for s in seqs)
    return threshold_for_episodes(seqs, budget_per_10k * healthy / 10_000)


def event_metrics(
    runs: Sequence[ScoredRun],
    threshold: float,
    *,
    horizon: int = HORIZON,
    min_lead: int = MIN_LEAD,
) -> dict[str, Any]:
    """Caught collapses, lead times and false alarms at ``threshold`` (module docstring)."""
    caught, n_collapsed, false_alarms, healthy_steps = 0, 0, 0, 0
    leads: list[int] = []
    for run in runs:
        steps, scores = _pre_onset(run)
        starts = steps[alarm_starts(scores, threshold)]
        if run.onset_step is None:
            false_alarms += starts.size
            healthy_steps += steps.size
            continue
        n_collapsed += 1
        early = run.onset_step - horizon
        false_alarms += int(np.sum(starts < early))
        healthy_steps += int(np.sum(steps < early))
        in_window = (steps >= early) & (np.nan_to_num(scores, nan=-np.inf) >= threshold)
        if in_window.any():
            first = int(steps[np.argmax(in_window)])
            if first <= run.onset_step - min_lead:
                caught += 1
                leads.append(run.onset_step - first)
    return {
        "n_runs": len(runs),
        "n_collapsed": n_collapsed,
        "caught": caught,
        "recall": caught / n_collapsed if n_collapsed else math.nan,
        "median_lead": float(np.median(leads)) if leads else math.nan,
        "lead_times": leads,
        "false_alarms": false_alarms,
        "healthy_steps": healthy_steps,
        "fa_per_10k": 1e4 * false_alarms / healthy_steps if healthy_steps else math.nan,
    }


def _finite_scores(scores: np.ndarray) -> np.ndarray:
    # AUC needs finite scores: NaN (no opinion) ranks lowest, +inf (a measured NaN
    # loss) highest, keeping the order of everything else
    finite = scores[np.isfinite(scores)]
    lo, hi = (finite.min() - 1, finite.max() + 1) if finite.size else (0.0, 1.0)
    return np.nan_to_num(scores, nan=lo, posinf=hi, neginf=lo)


def row_metrics(
    runs: Sequence[ScoredRun], *, horizon: int = HORIZON, probabilistic: bool = False
) -> dict[str, Any]:
    """PR-AUC, ROC-AUC (and Brier when scores are probabilities) over pre-onset rows."""
    ys, ss = [], []
    for run in runs:
        y, usable = collapse_targets(run.steps, run.onset_step, horizon)
        ys.append(np.asarray(y)[usable])
        ss.append(np.asarray(run.scores, dtype=np.float64)[usable])
    y = np.concatenate(ys) if ys else np.empty(0)
    s = np.concatenate(ss) if ss else np.empty(0)
    out = {"pr_auc": math.nan, "roc_auc": math.nan, "brier": math.nan, "y": y, "score": s}
    if y.size and 0 < y.sum() < y.size:
        fs = _finite_scores(s)
        out["pr_auc"] = float(average_precision_score(y, fs))
        out["roc_auc"] = float(roc_auc_score(y, fs))
    if probabilistic and y.size:
        out["brier"] = float(np.mean((np.nan_to_num(s, nan=0.0) - y) ** 2))
    return out


@dataclass
class EvalReport:
    """Every scorer x source x operating point, plus what plots need.

    ``results``: one dict per row (keys ``_RESULT_COLUMNS``); ``lead_times``: scorer ->
    lead times of caught collapses at the budget, all sources; ``row_scores``: scorer ->
    {"y", "score"} arrays over pre-onset rows, all sources (for PR curves and the
    reliability diagram; not serialised).
    """

    horizon: int
    budget_per_10k: float
    min_lead: int
    results: list[dict[str, Any]]
    lead_times: dict[str, list[int]] = field(default_factory=dict)
    row_scores: dict[str, dict[str, np.ndarray]] = field(default_factory=dict, repr=False)

    def to_frame(self) -> pd.DataFrame:
        """One row per (scorer, source, operating point)."""
        return pd.DataFrame(self.results, columns=list(_RESULT_COLUMNS))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (NaN becomes None)."""

        def clean(v: Any) -> Any:
            if isinstance(v, float) and not math.isfinite(v):
                return None
            return v.item() if isinstance(v, np.generic) else v

        return {
            "horizon": self.horizon,
            "budget_per_10k": self.budget_per_10k,
            "min_lead": self.min_lead,
            "results": [{k: clean(v) for k, v in r.items()} for r in self.results],
            "lead_times": {k: [int(x) for x in v] for k, v in self.lead_times.items()},
        }

    def get(
        self, scorer: str = "model", source: str = "all", operating_point: str = "budget"
    ) -> dict[str, Any]:
        """The result row for one scorer, source and operating point."""
        for r in self.results:
            if (r["scorer"], r["source"], r["operating_point"]) == (
                scorer,
                source,
                operating_point,
            ):
                return r
        have = sorted({(r["scorer"], r["source"], r["operating_point"]) for r in self.results})
        raise KeyError(
            f"no result for scorer={scorer!r}, source={source!r}, "
            f"operating_point={operating_point!r}; available: {have}"
        )

    def to_metrics(self) -> dict[str, float]:
        """Flat ``scorer/source/operating_point/metric`` -> finite float (for MLflow)."""
        out = {}
        for r in self.results:
            prefix = f"{r['scorer']}/{r['source']}/{r['operating_point']}"
            for key in _RESULT_COLUMNS[3:]:
                v = r[key]
                if isinstance(v, (int, float, np.number)) and math.isfinite(float(v)):
                    out[f"{prefix}/{key}"] = float(v)
        return out


def _scored(runs: Sequence, scores: Sequence[np.ndarray]) -> list[ScoredRun]:
    return [
        ScoredRun(
            r.run_id,
            r.meta.source,
            r.frame["step"].to_numpy(),
            np.asarray(s, float),
            r.meta.onset_step,
        )
        for r, s in zip(runs, scores, strict=True)
    ]


def _rows_for(
    name: str,
    scored: list[ScoredRun],
    thresholds: Mapping[str, float],
    *,
    horizon: int,
    min_lead: int,
    probabilistic: bool,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows, budget_extras = [], {}
    sources = ["all", *sorted({r.source for r in scored})]
    for source in sources:
        subset = scored if source == "all" else [r for r in scored if r.source == source]
        rm = row_metrics(subset, horizon=horizon, probabilistic=probabilistic)
        for point, thr in thresholds.items():
            em = event_metrics(subset, thr, horizon=horizon, min_lead=min_lead)
            rows.append(
                {
                    "scorer": name,
                    "source": source,
                    "operating_point": point,
                    "threshold": float(thr),
                    **{k: v for k, v in em.items() if k != "lead_times"},
                    "pr_auc": rm["pr_auc"],
                    "roc_auc": rm["roc_auc"],
                    "brier": rm["brier"],
                }
            )
            if source == "all" and point == "budget":
                budget_extras = {"lead_times": em["lead_times"], "y": rm["y"], "score": rm["score"]}
    return rows, budget_extras


def evaluate_runs(
    runs: Sequence,
    model=None,
    baselines: Sequence = (),
    *,
    budget_per_10k: float = 1.0,
    horizon: int | None = None,
    min_lead: int = MIN_LEAD,
    model_scores: Sequence[np.ndarray] | None = None,
) -> EvalReport:
    """Evaluate a RiskModel and baselines on ``runs`` (``RunRecord``s), every step scored.

    ``model_scores`` (one array per run, aligned with its rows) skips re-scoring when the
    caller already has them. Without a model, only the baselines are reported.
    """
    if horizon is None:
        horizon = model.horizon if model is not None else HORIZON
    # (name, per-step scores, native alarms or None, extra operating points, probabilistic)
    scorers: list[tuple[str, Callable, Callable | None, dict, bool]] = []
    if model is not None or model_scores is not None:
        precomputed = iter(model_scores) if model_scores is not None else None

        def score_model(frame: pd.DataFrame) -> np.ndarray:
            if precomputed is not None:
                return next(precomputed)
            # scored at the recorded rows, like the baselines (not across row gaps)
            return model.predict_run(frame, steps=frame["step"].to_numpy()).to_numpy()

        levels = {f"level:{k}": v for k, v in (model.thresholds if model else {}).items()}
        scorers.append(("model", score_model, None, levels, True))
    for b in baselines:
        scorers.append((b.name, b.score_run, b.alarm_run, {}, b.name == "config_only"))
    report = EvalReport(
        horizon=horizon, budget_per_10k=budget_per_10k, min_lead=min_lead, results=[]
    )
    for name, score_fn, alarm_fn, extra_points, probabilistic in scorers:
        scored = _scored(runs, [score_fn(r.frame) for r in runs])
        points = {"budget": threshold_at_budget(scored, budget_per_10k, horizon), **extra_points}
        kwargs = {"horizon": horizon, "min_lead": min_lead}
        rows, extras = _rows_for(name, scored, points, probabilistic=probabilistic, **kwargs)
        if alarm_fn is not None:
            # the native rule is a 0/1 score thresholded at 0.5; its AUCs are those of the rule
            native = _scored(runs, [alarm_fn(r.frame).astype(float) for r in runs])
            native_rows, _ = _rows_for(name, native, {"native": 0.5}, probabilistic=False, **kwargs)
            rows += native_rows
        report.results.extend(rows)
        report.lead_times[name] = extras.get("lead_times", [])
        report.row_scores[name] = {"y": extras.get("y"), "score": extras.get("score")}
    return report
