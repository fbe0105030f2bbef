"""Promotion: does a challenger take the ``champion`` alias? One rule, stated here.

Both models are scored by :func:`score_at_warn` on the same given runs, each at **its own
stored** ``warn`` level (set on its own healthy validation runs at training, never
refitted on the comparison runs: a threshold fitted on the runs it is graded on flatters
whichever model it is fitted for). The figures (:class:`WarnScore`):

- ``recall``: collapses caught 10 to H steps ahead (``MIN_LEAD`` to the model's horizon,
  as the evaluation counts them) over the collapsing runs;
- ``fa_per_10k``: false-alarm episodes per 10,000 healthy steps;
- ``within_budget``: the false alarms stay within the warn budget the model promised, by
  the one budget rule the evaluation's budget check applies too
  (``levels.allowed_false_alarms``: 2x slack, and at least one alarm allowed: on a few
  thousand healthy steps one false alarm says nothing about a 1-per-10k budget).

The rule (:func:`decide`), applied to the challenger against the current champion:

1. no champion yet (or one this code cannot load): the challenger is promoted;
2. the challenger must hold its own warn budget on the comparison runs, else it is kept
   out, whatever its recall (recall bought with false alarms is not an improvement).
   Budgets are the operator's training setting (``levels.DEFAULT_BUDGETS`` unless
   changed), not something a model learns, so both models normally share them; when
   the operator retrains with another budget, the new one is what they asked for;
3. then it is promoted only with a strictly higher recall, or the same recall with
   strictly fewer false alarms per 10k healthy steps. A tie keeps the champion;
4. a recall that cannot be measured (no collapsing run among the comparison runs) ranks
   lowest: such comparison runs cannot promote anyone over a champion that has a recall;
5. with ``ranking_runs`` (a retrain whose challenger was calibrated on the user's set-up:
   the comparison runs are then that set-up's held-out runs, ``setup_runs``), the ranking
   runs (the frozen benchmark, other set-ups) judge ranking only: levels set on one set-up
   say nothing of another's false alarms, but a challenger that learned this set-up must not
   forget how to rank the others. Its ROC-AUC there (every pre-onset row, as the evaluation
   counts it) may fall at most :data:`RANK_SLACK` below the champion's (:class:`RankScore`).

Names: each model is named by the name the caller gives (the registry's version number),
never by its folder's ``meta["version"]``, so that every message names one version one way.

:func:`compare` scores both models on the runs that *neither* trained or validated on
(their ids are stored in each model, ``predictor.core.seen_runs``): a champion graded on its
own training runs would look better than it is, and a challenger on its own, too.

>>> decision = compare(challenger, champion, runs)   # RiskModels, RunRecords
>>> decision.promoted, decision.reason
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from collapse_guard.predictor.core.levels import WARN, allowed_false_alarms
from collapse_guard.predictor.core.risk import RiskModel
from collapse_guard.predictor.core.seen_runs import SeenRuns
from collapse_guard.predictor.evaluate import MIN_LEAD, ScoredRun, event_metrics
from collapse_guard.predictor.evaluate.events import row_metrics
from collapse_guard.runfiles.records import RunRecord

__all__ = [
    "RANK_SLACK",
    "WARN",  # core.levels': the level promotion is judged at (the one users act on)
    "Decision",
    "RankScore",
    "WarnScore",
    "compare",
    "decide",
    "rank_on",
    "score_at_warn",
    "unseen_by",
]


# ROC-AUC the challenger may lose on the ranking runs (rule 5): about the spread of one
# model's ROC-AUC between two benchmarks of a dozen runs drawn from one dataset; a larger
# loss is a model that forgot the other set-ups, not a draw
RANK_SLACK = 0.05


@dataclass(frozen=True)
class WarnScore:
    """One model's figures at its own stored ``warn`` level on a set of runs."""

    version: str  # the model's meta["version"], to name it in reasons and logs
    threshold: float  # its stored warn threshold
    budget_steps: float  # its warn budget: healthy steps between false alarms
    n_runs: int
    n_collapsed: int
    caught: int
    false_alarms: int
    healthy_steps: int
    median_lead: float

    @property
    def recall(self) -> float:
        """Caught collapses over collapsing runs; NaN when there are none."""
        return self.caught / self.n_collapsed if self.n_collapsed else math.nan

    @property
    def fa_per_10k(self) -> float:
        """False alarms per 10,000 healthy steps; NaN without healthy steps."""
        return 1e4 * self.false_alarms / self.healthy_steps if self.healthy_steps else math.nan

    @property
    def allowed_false_alarms(self) -> int:
        """Most false alarms that still hold the budget (module docstring, point 2)."""
        return allowed_false_alarms(self.healthy_steps, self.budget_steps)

    @property
    def within_budget(self) -> bool:
        return self.false_alarms <= self.allowed_false_alarms

    def to_metrics(self) -> dict[str, float]:
        """Flat figures for MLflow (``compare.challenger.*``, ``compare.champion.*``)."""
        return {
            "recall_at_warn": self.recall,
            "fa_per_10k_at_warn": self.fa_per_10k,
            "false_alarms_at_warn": float(self.false_alarms),
            "allowed_false_alarms": float(self.allowed_false_alarms),
            "within_budget": float(self.within_budget),
            "median_lead_at_warn": self.median_lead,
            "caught": float(self.caught),
            "n_collapsed": float(self.n_collapsed),
            "healthy_steps": float(self.healthy_steps),
            "warn_threshold": self.threshold,
        }

    def describe(self) -> str:
        """One line: recall and false alarms against the budget."""
        budget = "within" if self.within_budget else "over"
        return (
            f"v{self.version}: caught {self.caught}/{self.n_collapsed}, "
            f"{self.false_alarms} false alarms in {self.healthy_steps} healthy steps "
            f"({budget} its budget of {self.allowed_false_alarms})"
        )


@dataclass(frozen=True)
class Decision:
    """The promotion verdict, the figures it rests on, and the runs it was measured on."""

    promoted: bool
    reason: str
    challenger: WarnScore | None = None
    champion: WarnScore | None = None
    run_ids: tuple[str, ...] = ()  # the comparison runs (unseen by both models)
    ranking: tuple[RankScore, RankScore] | None = None  # (challenger, champion), rule 5

    def to_metrics(self) -> dict[str, float]:
        """``compare.challenger.*`` and ``compare.champion.*`` figures (NaN left in)."""
        out: dict[str, float] = {"compare.n_runs": float(len(self.run_ids))}
        for role, score in (("challenger", self.challenger), ("champion", self.champion)):
            if score is not None:
                out |= {f"compare.{role}.{k}": v for k, v in score.to_metrics().items()}
        for role, rank in zip(("challenger", "champion"), self.ranking or (), strict=False):
            out |= {f"compare.{role}.ranking_roc_auc": rank.roc_auc}
        if self.ranking:
            out["compare.ranking_n_runs"] = float(self.ranking[0].n_runs)
        return out


@dataclass(frozen=True)
class RankScore:
    """One model's ranking on the ranking runs (rule 5): ROC-AUC over their pre-onset rows."""

    version: str
    roc_auc: float  # NaN when the runs hold no collapse or no healthy row
    n_runs: int

    def describe(self) -> str:
        return f"v{self.version}: ROC-AUC {self.roc_auc:.3f} on {self.n_runs} ranking runs"


def _name(model: RiskModel, name: str | None) -> str:
    return str(model.meta.get("version", "local")) if name is None else str(name)


def score_at_warn(
    model: RiskModel,
    runs: Sequence[RunRecord],
    scored: Mapping[str, ScoredRun] | None = None,
    *,
    name: str | None = None,
) -> WarnScore:
    """``model`` on ``runs`` at its own stored warn level, every recorded step scored.

    ``scored``: run id -> the model's risk on that run already computed (the training's
    ``EvalReport.model_runs``); those runs are not scored again. ``name``: how messages
    name the model (default its ``meta["version"]``)."""
    if WARN not in model.thresholds:
        raise ValueError(
            f"model {model.meta.get('version')!r} has no '{WARN}' level to be judged at "
            f"(thresholds: {model.thresholds}); fix: train it with collapse-guard train"
        )
    judged = _judged(model, runs, scored)
    threshold = float(model.thresholds[WARN])
    events = event_metrics(judged, threshold, horizon=model.horizon, min_lead=MIN_LEAD)
    return WarnScore(
        version=_name(model, name),
        threshold=threshold,
        budget_steps=float(model.budgets[WARN]),
        n_runs=events.n_runs,
        n_collapsed=events.n_collapsed,
        caught=events.caught,
        false_alarms=events.false_alarms,
        healthy_steps=events.healthy_steps,
        median_lead=events.median_lead,
    )


def rank_on(
    model: RiskModel,
    runs: Sequence[RunRecord],
    scored: Mapping[str, ScoredRun] | None = None,
    *,
    name: str | None = None,
) -> RankScore:
    """``model``'s ROC-AUC over the pre-onset rows of ``runs`` (rule 5), every step scored."""
    rows = row_metrics(_judged(model, runs, scored), horizon=model.horizon)
    return RankScore(_name(model, name), rows.roc_auc, len(runs))


def _judged(
    model: RiskModel, runs: Sequence[RunRecord], scored: Mapping[str, ScoredRun] | None
) -> list[ScoredRun]:
    known = scored or {}
    return [known.get(run.run_id) or _scored(model, run) for run in runs]


def _scored(model: RiskModel, run: RunRecord) -> ScoredRun:
    steps = run.frame["step"].to_numpy()
    risk = model.predict_run(run.frame, steps=steps).to_numpy()
    return ScoredRun(run.run_id, run.meta.source, steps, risk, run.meta.onset_step)


def _rank(recall: float) -> float:
    return -math.inf if math.isnan(recall) else recall


def _forgets(ranking: tuple[RankScore, RankScore] | None) -> bool:
    # NaN (no collapse among the ranking runs) compares False: nothing to forget there
    return ranking is not None and ranking[0].roc_auc < ranking[1].roc_auc - RANK_SLACK


def decide(
    challenger: WarnScore,
    champion: WarnScore | None,
    ranking: tuple[RankScore, RankScore] | None = None,
) -> Decision:
    """The promotion rule of the module docstring, on figures already measured.

    ``ranking``: (challenger, champion) on the ranking runs (rule 5), or None."""
    if champion is None:
        return Decision(True, "no champion yet", challenger, None, ranking=ranking)
    if not challenger.within_budget:
        return Decision(
            False,
            f"challenger exceeds its warn false-alarm budget: {challenger.describe()}",
            challenger,
            champion,
            ranking=ranking,
        )
    if _forgets(ranking):
        new, old = ranking
        return Decision(
            False,
            f"challenger ranks the other set-ups' runs worse by more than {RANK_SLACK}: "
            f"{new.describe()}; champion {old.describe()}",
            challenger,
            champion,
            ranking=ranking,
        )
    new, old = _rank(challenger.recall), _rank(champion.recall)
    # NaN (no healthy steps) compares False: no tie-break without false-alarm figures
    fewer_alarms = challenger.fa_per_10k < champion.fa_per_10k
    if new > old:
        verdict, promoted = "higher recall at warn", True
    elif new == old and new > -math.inf and fewer_alarms:
        verdict, promoted = "the same recall with fewer false alarms", True
    else:
        verdict, promoted = "no higher recall at warn (a tie keeps the champion)", False
    reason = f"{verdict}: challenger {challenger.describe()}; champion {champion.describe()}"
    if ranking is not None:
        reason += f"; ranking: {ranking[0].describe()}, {ranking[1].describe()}"
    return Decision(promoted, reason, challenger, champion, ranking=ranking)


def unseen_by(
    models: Sequence[RiskModel], runs: Sequence[RunRecord]
) -> tuple[list[RunRecord], int]:
    """(the runs none of ``models`` trained or validated on, how many were set apart)."""
    seen = [SeenRuns.from_meta(m.meta) for m in models]
    keep = [r for r in runs if all(s.role_of(r.run_id) is None for s in seen)]
    return keep, len(runs) - len(keep)


def compare(
    challenger: RiskModel,
    champion: RiskModel | None,
    runs: Sequence[RunRecord],
    scored: Mapping[str, ScoredRun] | None = None,
    *,
    ranking_runs: Sequence[RunRecord] = (),
    names: tuple[str | None, str | None] = (None, None),
) -> Decision:
    """Score both models on the given runs neither has seen, then :func:`decide`.

    ``runs``: ``RunRecord``s, e.g. the challenger's test runs, a frozen benchmark split
    and new runs; or the held-out runs of the set-up the challenger was calibrated on, with
    ``ranking_runs`` the other set-ups' (rule 5: ranking only). Without a champion, the
    challenger is promoted (its figures are still measured, on the runs it never saw, for
    the log). ``scored``: the challenger's risk on runs its training already scored
    (``score_at_warn``). ``names``: (challenger, champion) as messages name them.
    """
    models = [challenger] if champion is None else [challenger, champion]
    fair, set_apart = unseen_by(models, runs)
    mine, theirs = names
    if champion is None:
        figures = score_at_warn(challenger, fair, scored, name=mine)
        return Decision(True, "no champion yet", figures, None, _ids(fair))
    if not fair:
        return Decision(
            False,
            f"none of the {len(runs)} comparison runs is unseen by both models "
            f"({set_apart} trained or validated on); fix: pass runs neither trained on",
        )
    ranking = None
    ranked, _ = unseen_by(models, ranking_runs)
    if ranked:
        ranking = (
            rank_on(challenger, ranked, scored, name=mine),
            rank_on(champion, ranked, name=theirs),
        )
    decision = decide(
        score_at_warn(challenger, fair, scored, name=mine),
        score_at_warn(champion, fair, name=theirs),
        ranking,
    )
    note = f" ({len(fair)} runs unseen by both; {set_apart} set apart)"
    return Decision(
        decision.promoted,
        decision.reason + note,
        decision.challenger,
        decision.champion,
        _ids(fair),
        ranking,
    )


def _ids(runs: Sequence[RunRecord]) -> tuple[str, ...]:
    return tuple(r.run_id for r in runs)
