"""Event-level evaluation, as a user lives it (DESIGN.md "Predictor"), one module per job.

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
``holdout``        :func:`leave_one_group_out`: train without a family, test on it
``family_leads``   lead per *signal* family: a model-free account of what is missed,
                   per collapse kind and per set-up against its own healthy runs
``importance``     :func:`feature_gain_table`: the features with most gain
``separability``   :func:`separability`: how well each signal family's features alone
                   tell pre-collapse rows from healthy ones, per set-up
=================  ====================================================================

Everything public is re-exported here.
"""

from __future__ import annotations

from collapse_guard.predictor.evaluation.events import (
    MIN_LEAD,
    EventResult,
    RowResult,
    ScoredRun,
    event_metrics,
    healthy_sequences,
    row_metrics,
    run_outcome,
    threshold_at_budget,
)
from collapse_guard.predictor.evaluation.family_leads import (
    CONTROL_RATE,
    DEPARTURE_STD,
    FAMILIES,
    HEALTHY_CONTROL,
    REFERENCE_STEPS,
    family_lead_table,
    family_leads,
    setup_lead_table,
    signal_families,
)
from collapse_guard.predictor.evaluation.groups import (
    COLLAPSE_GROUPINGS,
    GROUPINGS,
    SETUP_GROUPINGS,
    UNKNOWN,
    GroupResult,
    cause_of,
    group_metrics,
    kind_of,
    run_groups,
    setup_of,
)
from collapse_guard.predictor.evaluation.holdout import (
    HeldOut,
    HoldoutReport,
    leave_one_group_out,
)
from collapse_guard.predictor.evaluation.importance import feature_gain_table
from collapse_guard.predictor.evaluation.report import (
    BUDGET_FACTOR,
    HEADLINE,
    BudgetCheck,
    EvalReport,
    GroupRow,
    ResultRow,
    evaluate_runs,
    scored_runs,
)
from collapse_guard.predictor.evaluation.scorer import ModelScorer, Scorer
from collapse_guard.predictor.evaluation.separability import feature_family, separability

__all__ = [
    "BUDGET_FACTOR",
    "COLLAPSE_GROUPINGS",
    "CONTROL_RATE",
    "DEPARTURE_STD",
    "FAMILIES",
    "GROUPINGS",
    "HEADLINE",
    "HEALTHY_CONTROL",
    "MIN_LEAD",
    "REFERENCE_STEPS",
    "SETUP_GROUPINGS",
    "UNKNOWN",
    "BudgetCheck",
    "EvalReport",
    "EventResult",
    "GroupResult",
    "GroupRow",
    "HeldOut",
    "HoldoutReport",
    "ModelScorer",
    "ResultRow",
    "RowResult",
    "ScoredRun",
    "Scorer",
    "cause_of",
    "evaluate_runs",
    "event_metrics",
    "family_lead_table",
    "family_leads",
    "feature_family",
    "feature_gain_table",
    "group_metrics",
    "healthy_sequences",
    "kind_of",
    "leave_one_group_out",
    "row_metrics",
    "run_groups",
    "run_outcome",
    "scored_runs",
    "separability",
    "setup_lead_table",
    "setup_of",
    "signal_families",
    "threshold_at_budget",
]
