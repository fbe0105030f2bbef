"""Event-level evaluation, as a user lives it (docs/design.md, "Predictor"), one module per job.

=================  ====================================================================
module             job
=================  ====================================================================
``events``         caught / lead / false alarms of one scorer at one threshold; row
                   metrics (average precision, ROC-AUC, Brier)
``groups``         what runs are grouped by: collapse kind, cause, onset (sudden or
                   develops), model family, optimizer, data
``scorer``         the :class:`Scorer` protocol; :class:`ModelScorer` for a RiskModel
``report``         :func:`evaluate_runs`: every scorer, source, operating point and
                   group; the headline is the model at its stored ``warn`` level
``rises``          the same rows inside LR rises and outside: false alarms per 10k
                   healthy steps and step ROC-AUC on each side
``baselines``      what people use today (DSI, OLMo-core, ZClip, KillLossSpike, tuned
                   single-signal thresholds, config-only), each a :class:`Scorer`
``reference``      the bundled model as the reference row of the user's own model
``plots``          figures of an evaluation and of one run (data in, a PNG out)
=================  ====================================================================

Everything public of ``events``, ``groups``, ``scorer``, ``report`` and ``rises`` is
re-exported here.
This layer scores and reports; it never fits the model (``training`` does, leave-one-group-out
included) and imports only ``core``.
"""

from __future__ import annotations

from collapse_guard.predictor.evaluate.events import (
    MIN_LEAD,
    EventResult,
    RowResult,
    RunOutcome,
    ScoredRun,
    event_metrics,
    fa_per_10k,
    false_alarm_starts,
    healthy_rows,
    healthy_sequences,
    ranking_auc,
    row_metrics,
    run_outcome,
    threshold_at_budget,
)
from collapse_guard.predictor.evaluate.groups import (
    COLLAPSE_GROUPINGS,
    GROUPINGS,
    NEVER_HELD_OUT,
    SETUP_GROUPINGS,
    UNKNOWN,
    GroupResult,
    cause_of,
    group_metrics,
    kind_of,
    run_groups,
    setup_of,
)
from collapse_guard.predictor.evaluate.report import (
    HEADLINE,
    BudgetCheck,
    EvalReport,
    GroupRow,
    ResultRow,
    evaluate_runs,
    scored_runs,
)
from collapse_guard.predictor.evaluate.rises import (
    NO_LR,
    RISE_COLUMNS,
    RiseResult,
    RiseSide,
    fold_rise_frame,
    rise_auc,
    rise_result,
    rise_summary,
)
from collapse_guard.predictor.evaluate.scorer import LEVEL_POINT, ModelScorer, Scorer, level_point

__all__ = [
    "COLLAPSE_GROUPINGS",
    "GROUPINGS",
    "HEADLINE",
    "LEVEL_POINT",
    "MIN_LEAD",
    "NEVER_HELD_OUT",
    "NO_LR",
    "RISE_COLUMNS",
    "SETUP_GROUPINGS",
    "UNKNOWN",
    "BudgetCheck",
    "EvalReport",
    "EventResult",
    "GroupResult",
    "GroupRow",
    "ModelScorer",
    "ResultRow",
    "RiseResult",
    "RiseSide",
    "RowResult",
    "RunOutcome",
    "ScoredRun",
    "Scorer",
    "cause_of",
    "evaluate_runs",
    "event_metrics",
    "fa_per_10k",
    "false_alarm_starts",
    "fold_rise_frame",
    "group_metrics",
    "healthy_rows",
    "healthy_sequences",
    "kind_of",
    "level_point",
    "ranking_auc",
    "rise_auc",
    "rise_result",
    "rise_summary",
    "row_metrics",
    "run_groups",
    "run_outcome",
    "scored_runs",
    "setup_of",
    "threshold_at_budget",
]
