"""One evaluation of the model and the baselines on a set of runs: ``evaluate_runs``.

Operating points, per scorer and per source (``fitted_on`` says where each threshold
came from, so that no figure passes for what it is not):

================  ==========  ==========================================================
point             fitted_on   threshold
================  ==========  ==========================================================
``level:warn``    validation  the model's stored level, set on healthy validation runs
                              at training: **the headline** (also ``level:watch``,
                              ``level:critical``)
``native``        rule        a rule baseline as its original fires it
``native``        validation  a learned baseline (tuned single-signal threshold,
                              config-only) at a threshold tuned on validation runs for
                              the evaluation's false-alarm budget
``budget``        test        the lowest threshold with at most ``budget_per_10k``
                              false alarms per 10k healthy steps *of the evaluated runs
                              of that source*: ROC-like, secondary ("threshold fitted on
                              test runs"); every scorer compared at one false-alarm rate
================  ==========  ==========================================================

Per-source rows use per-source thresholds for ``budget``; stored points are the same
everywhere (a user has one model). :attr:`EvalReport.budget_checks` says, per source and
level, whether the stored levels hold their false-alarm budgets on these runs within a
factor of 2. Every row also carries its figures inside LR rises and outside
(``rises``: :data:`~collapse_guard.predictor.evaluate.rises.RISE_COLUMNS`;
:meth:`EvalReport.rise_frame`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from collapse_guard.features.rises import frame_in_lr_rise
from collapse_guard.predictor.core.levels import WARN, allowed_false_alarms, per_10k
from collapse_guard.predictor.evaluate.events import (
    MIN_LEAD,
    EventResult,
    RowResult,
    ScoredRun,
    event_metrics,
    row_metrics,
    threshold_at_budget,
)
from collapse_guard.predictor.evaluate.groups import (
    GROUPINGS,
    GroupResult,
    group_metrics,
    run_groups,
)
from collapse_guard.predictor.evaluate.rises import (
    RISE_COLUMNS,
    RiseResult,
    rise_auc,
    rise_result,
    rise_summary,
)
from collapse_guard.predictor.evaluate.scorer import LEVEL_POINT, ModelScorer, Scorer, level_point
from collapse_guard.runfiles.label import HORIZON

__all__ = [
    "HEADLINE",
    "BudgetCheck",
    "EvalReport",
    "GroupRow",
    "ResultRow",
    "evaluate_runs",
    "scored_runs",
]

HEADLINE = "headline"  # each scorer at its own out-of-sample point (EvalReport.headline_point)

_EVENT_COLUMNS = (
    "n_runs",
    "n_collapsed",
    "caught",
    "recall",
    "median_lead",
    "false_alarms",
    "healthy_steps",
    "fa_per_10k",
)
_RESULT_COLUMNS = (
    "scorer",
    "source",
    "operating_point",
    "fitted_on",
    "threshold",
    *_EVENT_COLUMNS,
    "pr_auc",
    "roc_auc",
    "brier",
    *RISE_COLUMNS,
)
_GROUP_COLUMNS = (
    "scorer",
    "source",
    "operating_point",
    "fitted_on",
    "threshold",
    "grouping",
    "group",
    *_EVENT_COLUMNS,
)


@dataclass(frozen=True)
class ResultRow:
    """One scorer on one source at one operating point."""

    scorer: str
    source: str
    operating_point: str
    fitted_on: str  # "validation", "rule" or "test" (module docstring)
    threshold: float
    events: EventResult
    rows: RowResult  # threshold-free, the same for every point of a scorer and source
    rises: RiseResult | None = None  # inside LR rises and outside; None: no LR recorded

    def flat(self) -> dict[str, Any]:
        """One table row (keys: the report's frame columns)."""
        return {
            **_point_keys(self),
            **self.events.summary(),
            "pr_auc": self.rows.pr_auc,
            "roc_auc": self.rows.roc_auc,
            "brier": self.rows.brier,
            **rise_summary(self.rises),
        }


def _point_keys(row: ResultRow | GroupRow) -> dict[str, Any]:
    """Which scorer, on which source, at which operating point: every row's first keys."""
    return {
        "scorer": row.scorer,
        "source": row.source,
        "operating_point": row.operating_point,
        "fitted_on": row.fitted_on,
        "threshold": row.threshold,
    }


@dataclass(frozen=True)
class GroupRow:
    """One scorer on one source at one operating point, over one group of runs."""

    scorer: str
    source: str
    operating_point: str
    fitted_on: str
    threshold: float
    result: GroupResult

    def flat(self) -> dict[str, Any]:
        return {
            **_point_keys(self),
            "grouping": self.result.grouping,
            "group": self.result.group,
            **self.result.events.summary(),
        }


@dataclass(frozen=True)
class BudgetCheck:
    """Does a stored level hold its false-alarm budget on the evaluated runs of one source?"""

    source: str
    level: str
    budget_steps: float  # the level's budget: healthy steps between false alarms
    fa_per_10k: float
    false_alarms: int
    healthy_steps: int

    @property
    def budget_per_10k(self) -> float:
        return per_10k(self.budget_steps)

    @property
    def expected(self) -> float:
        """False alarms the budget expects on these healthy steps (< 1: too few to tell)."""
        return self.healthy_steps / self.budget_steps

    @property
    def holds(self) -> bool | None:
        """The one budget rule (``levels.allowed_false_alarms``); None when the runs hold
        too few healthy steps for the budget to expect one false alarm and none was raised."""
        if self.false_alarms == 0 and self.expected < 1:
            return None
        return self.false_alarms <= allowed_false_alarms(self.healthy_steps, self.budget_steps)


@dataclass
class EvalReport:
    """Every scorer x source x operating point, per group, and what the plots need.

    ``lead_times``: scorer -> lead times of caught collapses at its headline point, all
    sources; ``row_scores``: scorer -> {"y", "score"} over pre-onset rows, all sources
    (PR curves, reliability diagram; not serialised); ``model_runs``: the model's risk at
    every recorded step of each run, by run id, for whoever judges the model on these runs
    next (promotion reads them instead of scoring the runs again; not serialised).
    """

    horizon: int
    budget_per_10k: float
    min_lead: int
    results: list[ResultRow] = field(default_factory=list)
    groups: list[GroupRow] = field(default_factory=list)
    budget_checks: list[BudgetCheck] = field(default_factory=list)
    lead_times: dict[str, list[int]] = field(default_factory=dict)
    row_scores: dict[str, dict[str, np.ndarray]] = field(default_factory=dict, repr=False)
    model_runs: dict[str, ScoredRun] = field(default_factory=dict, repr=False)

    # ------------------------------------------------------------------ lookup
    @property
    def scorers(self) -> list[str]:
        return list(dict.fromkeys(r.scorer for r in self.results))

    def headline_point(self, scorer: str) -> str:
        """A scorer's out-of-sample point: the stored ``level:warn``, else its ``native``
        rule, else (a scorer with neither) the ROC-like ``budget``."""
        points = {r.operating_point for r in self.results if r.scorer == scorer}
        for point in (level_point(WARN), "native"):
            if point in points:
                return point
        return "budget"

    def result(
        self, scorer: str = "model", source: str = "all", operating_point: str = HEADLINE
    ) -> ResultRow:
        """The row for one scorer, source and point (``headline``: the scorer's own)."""
        if operating_point == HEADLINE:
            operating_point = self.headline_point(scorer)
        for r in self.results:
            if (r.scorer, r.source, r.operating_point) == (scorer, source, operating_point):
                return r
        have = sorted({(r.scorer, r.source, r.operating_point) for r in self.results})
        raise KeyError(
            f"no result for scorer={scorer!r}, source={source!r}, "
            f"operating_point={operating_point!r}; available: {have}"
        )

    # ------------------------------------------------------------------ tables
    def to_frame(self) -> pd.DataFrame:
        """One row per (scorer, source, operating point)."""
        return pd.DataFrame([r.flat() for r in self.results], columns=list(_RESULT_COLUMNS))

    def rise_frame(self, source: str = "all") -> pd.DataFrame:
        """Inside LR rises and outside, one row per scorer and out-of-sample point of
        ``source`` (stored levels, rules, tuned thresholds; not the ROC-like ``budget``):
        ``scorer``, ``operating_point``, ``fitted_on``, ``n_runs``, then RISE_COLUMNS."""
        frame = self.to_frame()
        frame = frame[(frame["source"] == source) & (frame["fitted_on"] != "test")]
        keys = ["scorer", "operating_point", "fitted_on", "n_runs"]
        return frame[[*keys, *RISE_COLUMNS]].reset_index(drop=True)

    def groups_frame(self) -> pd.DataFrame:
        """One row per (scorer, source, operating point, grouping, group)."""
        return pd.DataFrame([g.flat() for g in self.groups], columns=list(_GROUP_COLUMNS))

    def budget_frame(self) -> pd.DataFrame:
        """One row per (source, level): observed FA/10k beside the level's budget."""
        rows = [
            {
                **asdict(c),
                "budget_per_10k": c.budget_per_10k,
                "expected": c.expected,
                "holds": c.holds,
            }
            for c in self.budget_checks
        ]
        columns = ["source", "level", "budget_per_10k", "fa_per_10k", "false_alarms"]
        return pd.DataFrame(rows, columns=[*columns, "healthy_steps", "expected", "holds"])

    def group_table(
        self, grouping: str = "kind", source: str = "all", operating_point: str = HEADLINE
    ) -> pd.DataFrame:
        """Wide view of ``groups``: one row per group, ``n`` then ``<scorer> recall`` and
        ``<scorer> lead`` for every scorer (the model first), each at ``operating_point``
        (``headline``: each scorer's own)."""
        frame = self.groups_frame()
        frame = frame[(frame["grouping"] == grouping) & (frame["source"] == source)]
        groups = sorted(set(frame["group"]))
        out = pd.DataFrame(index=pd.Index(groups, name=grouping))
        for scorer in dict.fromkeys(frame["scorer"]):
            point = self.headline_point(scorer) if operating_point == HEADLINE else operating_point
            rows = frame[(frame["scorer"] == scorer) & (frame["operating_point"] == point)]
            rows = rows.set_index("group")
            if "n" not in out:
                count = "n_collapsed" if grouping in ("kind", "cause", "onset") else "n_runs"
                out["n"] = rows[count].reindex(groups).astype("Int64")
            out[f"{scorer} recall"] = rows["recall"].reindex(groups)
            out[f"{scorer} lead"] = rows["median_lead"].reindex(groups)
        return out

    # ------------------------------------------------------------- serialising
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (NaN becomes None)."""
        return {
            "horizon": self.horizon,
            "budget_per_10k": self.budget_per_10k,
            "min_lead": self.min_lead,
            "results": [_clean(r.flat()) for r in self.results],
            "groups": [_clean(g.flat()) for g in self.groups],
            "budget_checks": _records(self.budget_frame()),
            "lead_times": {k: [int(x) for x in v] for k, v in self.lead_times.items()},
        }

    def to_metrics(self) -> dict[str, float]:
        """Flat ``scorer/source/operating_point/metric`` -> finite float (for MLflow);
        per group at each scorer's headline point, all sources:
        ``scorer/all/<point>/<grouping>/<group>/{n_collapsed,recall,median_lead}``."""
        out = {}
        for r in self.results:
            prefix = f"{r.scorer}/{r.source}/{r.operating_point}"
            out |= _finite(prefix, r.flat(), _RESULT_COLUMNS[4:])
        for g in self.groups:
            if g.source != "all" or g.operating_point != self.headline_point(g.scorer):
                continue
            group = re.sub(r"[^\w.\- ]", "_", g.result.group)  # MLflow's metric name rule
            prefix = f"{g.scorer}/all/{g.operating_point}/{g.result.grouping}/{group}"
            out |= _finite(prefix, g.flat(), ("n_collapsed", "recall", "median_lead"))
        return {k.replace(":", "_"): v for k, v in out.items()}  # MLflow refuses ':'


def _clean(row: Mapping[str, Any]) -> dict[str, Any]:
    def clean(v: Any) -> Any:
        v = v.item() if isinstance(v, np.generic) else v
        return None if isinstance(v, float) and not math.isfinite(v) else v

    return {k: clean(v) for k, v in row.items()}


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [_clean(r) for r in frame.astype(object).to_dict("records")]


def _finite(prefix: str, row: Mapping[str, Any], keys: Sequence[str]) -> dict[str, float]:
    out = {}
    for key in keys:
        v = row[key]
        if isinstance(v, int | float | np.number) and math.isfinite(float(v)):
            out[f"{prefix}/{key}"] = float(v)
    return out


def scored_runs(
    runs: Sequence, scores: Sequence[np.ndarray], horizon: int = HORIZON
) -> list[ScoredRun]:
    """``RunRecord``s and their per-row scores as ScoredRuns (with every grouping, and
    which rows lie in an LR rise of ``horizon`` steps)."""
    return [
        ScoredRun(
            r.run_id,
            r.meta.source,
            r.frame["step"].to_numpy(),
            np.asarray(s, dtype=np.float64),
            r.meta.onset_step,
            run_groups(r.meta),
            frame_in_lr_rise(r.frame, horizon),
        )
        for r, s in zip(runs, scores, strict=True)
    ]


def _points(
    scorer: Scorer, scored: list[ScoredRun], native: list[ScoredRun] | None, budget: float, horizon
) -> list[tuple[str, str, float, list[ScoredRun]]]:
    # (point, fitted_on, threshold, the runs it thresholds) for one source's runs
    stored = scorer.operating_points()
    points = [(name, "validation", float(thr), scored) for name, thr in stored.items()]
    if native is not None:
        # the original's rule as 0/1 alarms, thresholded at 0.5
        points.append(("native", "rule", 0.5, native))
    points.append(("budget", "test", threshold_at_budget(scored, budget, horizon), scored))
    return points


def evaluate_runs(
    runs: Sequence,
    model=None,
    baselines: Sequence[Scorer] = (),
    *,
    budget_per_10k: float = 1.0,
    horizon: int | None = None,
    min_lead: int = MIN_LEAD,
    model_scores: Sequence[np.ndarray] | None = None,
    groupings: Sequence[str] = GROUPINGS,
) -> EvalReport:
    """Evaluate a RiskModel and baselines on ``runs`` (``RunRecord``s), every row scored.

    ``model_scores`` (one array per run, aligned with its rows) skips re-scoring when
    the caller already has them. Without a model, only the baselines are reported.
    ``budget_per_10k``: the false-alarm rate of the ROC-like ``budget`` point.
    """
    if horizon is None:
        horizon = model.horizon if model is not None else HORIZON
    scorers: list[Scorer] = []
    if model is not None or model_scores is not None:
        scorers.append(ModelScorer(model, scores=model_scores))
    scorers.extend(baselines)
    report = EvalReport(horizon=horizon, budget_per_10k=budget_per_10k, min_lead=min_lead)
    kwargs = {"horizon": horizon, "min_lead": min_lead}
    sources = ["all", *sorted({r.meta.source for r in runs})]
    for scorer in scorers:
        scored = scored_runs(runs, [scorer.score_run(r.frame) for r in runs], horizon)
        if scorer.name == "model":
            report.model_runs = {s.run_id: s for s in scored}
        alarms = [scorer.alarm_run(r.frame) for r in runs]
        native = None
        if all(a is not None for a in alarms) and runs:
            native = [
                s.with_scores(np.asarray(a, float)) for s, a in zip(scored, alarms, strict=True)
            ]
        for source in sources:
            keep = [source == "all" or s.source == source for s in scored]
            subset = [s for s, k in zip(scored, keep, strict=True) if k]
            native_subset = (
                None if native is None else [s for s, k in zip(native, keep, strict=True) if k]
            )
            rows = row_metrics(subset, horizon=horizon, probabilistic=scorer.probabilistic)
            auc = rise_auc(subset, horizon)
            if source == "all":
                report.row_scores[scorer.name] = {"y": rows.y, "score": rows.score}
            for point, fitted_on, thr, runs_at in _points(
                scorer, subset, native_subset, budget_per_10k, horizon
            ):
                events = event_metrics(runs_at, thr, **kwargs)
                rises = rise_result(runs_at, thr, horizon=horizon, auc=auc)
                key = (scorer.name, source, point, fitted_on, thr)
                report.results.append(ResultRow(*key, events, rows, rises))
                for grouping in groupings:
                    for g in group_metrics(runs_at, thr, by=grouping, **kwargs):
                        report.groups.append(GroupRow(*key, g))
        head = report.result(scorer.name, "all", HEADLINE)
        report.lead_times[scorer.name] = list(head.events.lead_times)
    if model is not None and model.thresholds:
        report.budget_checks = _budget_checks(report, model.budgets)
    return report


def _budget_checks(report: EvalReport, budgets: Mapping[str, float]) -> list[BudgetCheck]:
    checks = []
    for r in report.results:
        if r.scorer != "model" or not r.operating_point.startswith(LEVEL_POINT):
            continue
        level = r.operating_point.removeprefix(LEVEL_POINT)
        if level not in budgets:
            continue
        checks.append(
            BudgetCheck(
                source=r.source,
                level=level,
                budget_steps=float(budgets[level]),
                fa_per_10k=r.events.fa_per_10k,
                false_alarms=r.events.false_alarms,
                healthy_steps=r.events.healthy_steps,
            )
        )
    return checks
