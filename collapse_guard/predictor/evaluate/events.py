"""Event-level metrics of one scorer at one threshold, as a user lives them.

Every scorer gives a score at *every* recorded step of a run; a threshold turns scores
into alarms, and consecutive alarmed steps are one alarm episode. Then, with H the
horizon (docs/design.md, "Predictor"):

- a collapse is *caught* when the first alarmed step in the H steps before onset,
  [onset - H, onset), comes at least ``min_lead`` (``MIN_LEAD``) steps before onset. An episode
  already running when that stretch begins counts from its first step inside it: the
  user is being warned then;
- its *lead time* is onset minus that first alarmed step;
- a *false alarm* is an episode that starts on a healthy run, or on a collapsing run
  earlier than H steps before onset; *healthy steps* are those steps.

Row-level metrics over every step before onset (:func:`row_metrics`): average precision,
ROC-AUC and, for scorers that give probabilities, the Brier score (scikit-learn's).
The same figures inside LR rises and outside: :mod:`~collapse_guard.predictor.evaluate.rises`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from sklearn.metrics import average_precision_score, brier_score_loss, roc_auc_score

from collapse_guard.predictor.core.levels import alarm_starts, threshold_for_episodes
from collapse_guard.runfiles.label import HORIZON, MIN_LEAD, collapse_targets

__all__ = [
    "MIN_LEAD",
    "EventResult",
    "RowResult",
    "RunOutcome",
    "ScoredRun",
    "event_metrics",
    "fa_per_10k",
    "false_alarm_starts",
    "healthy_rows",
    "healthy_sequences",
    "ranking_auc",
    "row_metrics",
    "run_outcome",
    "threshold_at_budget",
]


@dataclass(frozen=True)
class ScoredRun:
    """One run's per-step scores from one scorer, with what the report groups it by.

    ``groups`` holds the run's labels for breakdowns: ``kind`` and ``cause`` of its
    collapse (``kinds``), its ``onset`` (sudden / develops), and the model ``family``,
    ``optimizer`` and ``data`` it was trained with (``holdout``). ``in_rise``: per row,
    whether the step lies in an LR rise (``features.rises``); None: no LR recorded.
    """

    run_id: str
    source: str
    steps: np.ndarray
    scores: np.ndarray
    onset_step: int | None
    groups: dict[str, str | None] = field(default_factory=dict)
    in_rise: np.ndarray | None = field(default=None, repr=False)

    @property
    def collapsed(self) -> bool:
        return self.onset_step is not None

    def with_scores(self, scores: np.ndarray) -> ScoredRun:
        """The same run with other scores (e.g. a native rule's 0/1 alarms)."""
        return ScoredRun(
            self.run_id,
            self.source,
            self.steps,
            np.asarray(scores, float),
            self.onset_step,
            self.groups,
            self.in_rise,
        )


@dataclass(frozen=True)
class EventResult:
    """Caught collapses, lead times and false alarms of one scorer at one threshold."""

    n_runs: int
    n_collapsed: int
    lead_times: tuple[int, ...]  # of the caught collapses, in run order
    false_alarms: int
    healthy_steps: int

    @property
    def caught(self) -> int:
        return len(self.lead_times)

    @property
    def recall(self) -> float:
        return self.caught / self.n_collapsed if self.n_collapsed else math.nan

    @property
    def median_lead(self) -> float:
        return float(np.median(self.lead_times)) if self.lead_times else math.nan

    @property
    def fa_per_10k(self) -> float:
        """False alarms per 10,000 healthy steps."""
        return fa_per_10k(self.false_alarms, self.healthy_steps)

    def summary(self) -> dict[str, float | int]:
        """The scalar figures, for tables."""
        return {
            "n_runs": self.n_runs,
            "n_collapsed": self.n_collapsed,
            "caught": self.caught,
            "recall": self.recall,
            "median_lead": self.median_lead,
            "false_alarms": self.false_alarms,
            "healthy_steps": self.healthy_steps,
            "fa_per_10k": self.fa_per_10k,
        }


def fa_per_10k(false_alarms: int, healthy_steps: int) -> float:
    """False alarms per 10,000 healthy steps; NaN without healthy steps."""
    return 1e4 * false_alarms / healthy_steps if healthy_steps else math.nan


def healthy_rows(run: ScoredRun, horizon: int = HORIZON) -> np.ndarray:
    """Per row, whether it is a healthy step: all of a healthy run, a collapsing run's
    before onset - H."""
    if run.onset_step is None:
        return np.ones(run.steps.size, dtype=bool)
    return run.steps < run.onset_step - horizon


def false_alarm_starts(run: ScoredRun, threshold: float, horizon: int = HORIZON) -> np.ndarray:
    """Row indices where a false alarm starts: an alarm episode starting on a healthy row."""
    starts = alarm_starts(run.scores, threshold)
    return starts[healthy_rows(run, horizon)[starts]]


def healthy_sequences(runs: Sequence[ScoredRun], horizon: int = HORIZON) -> list[np.ndarray]:
    """Scores at healthy steps: all of a healthy run, and a collapsing run before onset - H."""
    out = []
    for run in runs:
        scores = np.asarray(run.scores, dtype=np.float64)
        out.append(
            scores if run.onset_step is None else scores[run.steps < run.onset_step - horizon]
        )
    return out


def threshold_at_budget(
    runs: Sequence[ScoredRun], budget_per_10k: float = 1.0, horizon: int = HORIZON
) -> float:
    """Lowest threshold with <= budget_per_10k false alarms per 10,000 healthy steps of ``runs``."""
    seqs = healthy_sequences(runs, horizon)
    healthy = sum(s.size for s in seqs)
    return threshold_for_episodes(seqs, budget_per_10k * healthy / 10_000)


@dataclass(frozen=True)
class RunOutcome:
    """One run at one threshold, as a user lives it."""

    lead: int | None  # onset minus the first alarm in [onset - H, onset - min_lead]; None: missed
    false_alarms: int  # alarm episodes starting on healthy steps
    healthy_steps: int


def run_outcome(
    run: ScoredRun, threshold: float, horizon: int = HORIZON, min_lead: int = MIN_LEAD
) -> RunOutcome:
    """Lead time (if caught), false alarms and healthy steps of one run at ``threshold``."""
    false_alarms = int(false_alarm_starts(run, threshold, horizon).size)
    healthy_steps = int(healthy_rows(run, horizon).sum())
    if run.onset_step is None:
        return RunOutcome(None, false_alarms, healthy_steps)
    steps, early = run.steps, run.onset_step - horizon
    # what comes at and after onset is neither caught nor false
    in_window = (steps >= early) & (steps < run.onset_step)
    in_window &= np.nan_to_num(run.scores, nan=-np.inf) >= threshold
    if in_window.any():
        first = int(steps[np.argmax(in_window)])
        if first <= run.onset_step - min_lead:
            return RunOutcome(run.onset_step - first, false_alarms, healthy_steps)
    return RunOutcome(None, false_alarms, healthy_steps)


def event_metrics(
    runs: Sequence[ScoredRun],
    threshold: float,
    *,
    horizon: int = HORIZON,
    min_lead: int = MIN_LEAD,
) -> EventResult:
    """Caught collapses, lead times and false alarms at ``threshold`` (module docstring)."""
    n_collapsed = false_alarms = healthy_steps = 0
    leads: list[int] = []
    for run in runs:
        outcome = run_outcome(run, threshold, horizon, min_lead)
        false_alarms += outcome.false_alarms
        healthy_steps += outcome.healthy_steps
        if run.collapsed:
            n_collapsed += 1
            if outcome.lead is not None:
                leads.append(outcome.lead)
    return EventResult(len(runs), n_collapsed, tuple(leads), false_alarms, healthy_steps)


@dataclass(frozen=True)
class RowResult:
    """Threshold-free figures over pre-onset rows; ``y``/``score`` feed the PR curve."""

    pr_auc: float
    roc_auc: float
    brier: float
    y: np.ndarray = field(repr=False)
    score: np.ndarray = field(repr=False)


def _finite_scores(scores: np.ndarray) -> np.ndarray:
    # AUC needs finite scores: NaN (no opinion) ranks lowest, +inf (a measured NaN
    # loss) highest, keeping the order of everything else
    finite = scores[np.isfinite(scores)]
    lo, hi = (finite.min() - 1, finite.max() + 1) if finite.size else (0.0, 1.0)
    return np.nan_to_num(scores, nan=lo, posinf=hi, neginf=lo)


def ranking_auc(y: np.ndarray, scores: np.ndarray) -> tuple[float, float]:
    """(average precision, ROC-AUC) of ``scores`` against 0/1 targets ``y``; NaN, NaN
    unless both classes are there."""
    if not (y.size and 0 < y.sum() < y.size):
        return math.nan, math.nan
    fs = _finite_scores(scores)
    return float(average_precision_score(y, fs)), float(roc_auc_score(y, fs))


def row_metrics(
    runs: Sequence[ScoredRun], *, horizon: int = HORIZON, probabilistic: bool = False
) -> RowResult:
    """Average precision, ROC-AUC (and Brier when scores are probabilities) over pre-onset rows.

    A row's target is 1 when onset lies within the next H steps
    (``runfiles.label.collapse_targets``); rows at and after onset are left out.
    """
    ys, ss = [], []
    for run in runs:
        y, usable = collapse_targets(run.steps, run.onset_step, horizon)
        ys.append(np.asarray(y)[usable])
        ss.append(np.asarray(run.scores, dtype=np.float64)[usable])
    y = np.concatenate(ys).astype(int) if ys else np.empty(0, int)
    s = np.concatenate(ss) if ss else np.empty(0)
    pr_auc, roc_auc = ranking_auc(y, s)
    brier = math.nan
    if probabilistic and y.size:
        # no opinion yet (NaN, before the first full window) counts as probability 0
        brier = float(brier_score_loss(y, np.clip(np.nan_to_num(s, nan=0.0), 0, 1), pos_label=1))
    return RowResult(pr_auc, roc_auc, brier, y, s)
