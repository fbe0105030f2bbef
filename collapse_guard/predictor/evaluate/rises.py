"""The evaluation inside LR rises and outside (issue 34, item 5).

Healthy runs reach their highest risk while the LR rises (warmup's end, a safe re-warm),
so every evaluation row is split at the line ``features.rises`` draws: a step is *inside*
when the run's ``lr`` rose at it or within the horizon's steps before it. Per side:

- false alarms per 10k healthy steps: an alarm episode on a healthy step (``events``)
  counts on the side of the step it starts on; the healthy steps are counted per side;
- the step ROC-AUC over the pre-onset rows of that side (the row targets of ``events``).

Only runs that record an LR are split (``runs_with_lr``); a run without one is on
neither side, and a set of runs none of which records an LR has no split at all (None:
"no LR recorded").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from collapse_guard.predictor.evaluate.events import (
    ScoredRun,
    fa_per_10k,
    false_alarm_starts,
    healthy_rows,
    ranking_auc,
)
from collapse_guard.runfiles.label import HORIZON, collapse_targets

__all__ = [
    "NO_LR",
    "RISE_COLUMNS",
    "RiseResult",
    "RiseSide",
    "fold_rise_frame",
    "rise_auc",
    "rise_result",
    "rise_summary",
]

NO_LR = "no LR recorded"  # what a table says where no run records an LR
_SIDE_FIGURES = ("false_alarms", "healthy_steps", "fa_per_10k", "roc_auc")
RISE_COLUMNS: tuple[str, ...] = (
    "runs_with_lr",
    *(f"{side}_{figure}" for side in ("inside", "outside") for figure in _SIDE_FIGURES),
)


@dataclass(frozen=True)
class RiseSide:
    """One side of the line: inside LR rises, or outside."""

    false_alarms: int
    healthy_steps: int
    roc_auc: float  # step ROC-AUC over the side's pre-onset rows; NaN without both classes

    @property
    def fa_per_10k(self) -> float:
        return fa_per_10k(self.false_alarms, self.healthy_steps)


@dataclass(frozen=True)
class RiseResult:
    """One scorer at one threshold, inside LR rises and outside, over the runs with an LR."""

    runs_with_lr: int
    inside: RiseSide
    outside: RiseSide

    def summary(self) -> dict[str, float | int]:
        """The scalar figures under :data:`RISE_COLUMNS`."""
        out: dict[str, float | int] = {"runs_with_lr": self.runs_with_lr}
        for name, side in (("inside", self.inside), ("outside", self.outside)):
            out |= {f"{name}_{figure}": getattr(side, figure) for figure in _SIDE_FIGURES}
        return out


def rise_summary(result: RiseResult | None) -> dict[str, float | int]:
    """:meth:`RiseResult.summary`, or every figure NaN (0 runs with an LR) for None."""
    if result is None:
        return {"runs_with_lr": 0, **dict.fromkeys(RISE_COLUMNS[1:], math.nan)}
    return result.summary()


def _with_lr(runs: Iterable[ScoredRun]) -> list[ScoredRun]:
    return [r for r in runs if r.in_rise is not None]


def rise_auc(runs: Sequence[ScoredRun], horizon: int = HORIZON) -> tuple[float, float] | None:
    """(inside, outside) step ROC-AUC over the pre-onset rows of the runs with an LR;
    None when no run records one. Threshold-free: one pair per scorer and set of runs."""
    runs = _with_lr(runs)
    if not runs:
        return None
    parts: dict[bool, tuple[list, list]] = {True: ([], []), False: ([], [])}
    for run in runs:
        y, usable = collapse_targets(run.steps, run.onset_step, horizon)
        scores = np.asarray(run.scores, dtype=np.float64)
        for inside in (True, False):
            keep = usable & (run.in_rise == inside)
            parts[inside][0].append(np.asarray(y)[keep])
            parts[inside][1].append(scores[keep])
    inside, outside = (
        ranking_auc(np.concatenate(ys).astype(int), np.concatenate(ss))[1]
        for ys, ss in (parts[True], parts[False])
    )
    return inside, outside


def rise_result(
    runs: Sequence[ScoredRun],
    threshold: float,
    *,
    horizon: int = HORIZON,
    auc: tuple[float, float] | None = None,
) -> RiseResult | None:
    """False alarms and healthy steps at ``threshold`` on each side of the line, with
    the ROC-AUC of :func:`rise_auc` (``auc``: already computed for these runs' scores);
    None when no run records an LR."""
    runs = _with_lr(runs)
    if not runs:
        return None
    if auc is None:
        auc = rise_auc(runs, horizon)
    alarms = {True: 0, False: 0}
    steps = {True: 0, False: 0}
    for run in runs:
        starts = run.in_rise[false_alarm_starts(run, threshold, horizon)]
        healthy = run.in_rise[healthy_rows(run, horizon)]
        for inside in (True, False):
            alarms[inside] += int(np.sum(starts == inside))
            steps[inside] += int(np.sum(healthy == inside))
    return RiseResult(
        len(runs),
        RiseSide(alarms[True], steps[True], auc[0]),
        RiseSide(alarms[False], steps[False], auc[1]),
    )


def fold_rise_frame(folds: Iterable, scorer: str = "model") -> pd.DataFrame:
    """One row per fold of a leave-one-group-out (``fold.group``, ``fold.report``): the
    ``scorer`` at its headline point inside LR rises and outside (:data:`RISE_COLUMNS`),
    then the row ``mean`` (unweighted over folds, as the holdout's own mean)."""
    rows = []
    for fold in folds:
        row = fold.report.result(scorer, "all").flat()
        point = {"group": fold.group, "operating_point": row["operating_point"]}
        rows.append({**point, **{k: row[k] for k in RISE_COLUMNS}})
    frame = pd.DataFrame(rows, columns=["group", "operating_point", *RISE_COLUMNS])
    if frame.empty:
        return frame
    mean = frame[list(RISE_COLUMNS)].astype(float).mean()  # NaN (no LR) skipped
    counts = [c for c in RISE_COLUMNS if not c.endswith(("fa_per_10k", "roc_auc"))]
    mean[counts] = frame[counts].sum()
    last = {"group": "mean", "operating_point": frame["operating_point"].iloc[0], **mean}
    return pd.concat([frame, pd.DataFrame([last])], ignore_index=True)
