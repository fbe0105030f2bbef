"""Alarm levels from false-alarm budgets.

A budget is the number of healthy steps the user accepts between two false alarms
(alibi-detect's "expected run time"): ``warn = 5_000`` means at most one false alarm
per 5,000 healthy steps. A false alarm is an alarm *episode*: consecutive steps at
or over the threshold count once, because that is how a user lives it (one page,
however long it stays red).

Thresholds are chosen on healthy validation runs: for each level, the smallest
threshold such that it, and every higher threshold, raises no more episodes than the
budget allows. "Every higher" matters because the episode count is not monotone in
the threshold (raising it can split one episode into two).

========  ===================  ============================================
level     default budget       meaning
========  ===================  ============================================
watch     1 / 1,000 steps      look at the run; cheap actions (checkpoint)
warn      1 / 5,000 steps      act: hold the LR, tighten clipping
critical  1 / 100,000 steps    about to collapse: roll back
========  ===================  ============================================

With fewer healthy validation steps than a budget, zero false alarms are allowed
and the threshold sits just above the highest healthy score: the guarantee is then
only as good as the validation set is large (``resolution`` in the stored meta says
how many healthy steps backed it).

Budgets have one unit, healthy steps between false alarms; "false alarms per 10k healthy
steps" is a rate for reading, converted in one place (:func:`per_10k`). Whether runs
*hold* a budget is one rule, :func:`allowed_false_alarms`, that the evaluation's budget
check and promotion both apply.

**The run as the unit.** A healthy run's highest risk comes once (the warmup's end, a
re-warm), so few runs are few samples of it, however many steps they hold. A budget of one
false alarm per ``B`` steps, over runs of ``L`` steps, is a per-run target: a new run may
alarm with probability at most ``L / B`` (:func:`run_target`; each run that reaches a level
counted as one false alarm, the hold keeping a peak's flicker one episode). Of ``K``
exchangeable runs whose peaks ``j`` reach a level, a new run's chance to reach it is, for
any continuous law of peaks, ``Beta(j + 1, K - j)``-distributed: ``(j + 1) / (K + 1)`` in
expectation (just above the largest of ``K``: ``1 / (K + 1)``), and at most
:func:`exceedance_bound` with the confidence asked. :func:`runs_needed` runs with none
above a level certify a target.

A stored level is a probability in (0, 1] (:func:`check_thresholds`, the one rule every
reader of levels applies); levels set above every healthy risk stop at 1
(:func:`valid_level`).
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Mapping, Sequence

import numpy as np

from collapse_guard.errors import UserInputError

# scipy.stats (the beta law) is imported inside the run bounds: levels are read by the
# service and the guard, which never set them

__all__ = [
    "BUDGET_FACTOR",
    "CRITICAL",
    "DEFAULT_BUDGETS",
    "LEVELS",
    "OK",
    "RISK_LEVELS",
    "WARN",
    "WATCH",
    "Level",
    "ThresholdError",
    "alarm_starts",
    "allowed_false_alarms",
    "check_thresholds",
    "episode_counts",
    "exceedance_bound",
    "level_of",
    "order_statistic_level",
    "per_10k",
    "run_target",
    "runs_needed",
    "threshold_for_episodes",
    "thresholds_from_budgets",
    "thresholds_or_none",
    "valid_level",
]


@enum.unique
class Level(str, enum.Enum):
    """A risk reading's level, ordered by severity: ``level >= WARN`` means warn or above.

    A ``str`` enum, so a level is its own name on the wire, in JSON, in a run file's
    events and in a model's stored thresholds (``Level.WARN == "warn"``); the order is
    the one defined here, never the strings' (``"watch" > "warn"`` alphabetically). Order
    comparisons take a ``Level`` or a level's name; anything else is a ``TypeError``.
    """

    OK = "ok"  # below the lowest threshold
    WATCH = "watch"
    WARN = "warn"
    CRITICAL = "critical"

    @classmethod
    def parse(cls, value: object) -> Level:
        """``value`` as a Level, or a :class:`UserInputError` that names the four."""
        if isinstance(value, cls):
            return value
        try:
            return cls(value)
        except ValueError:
            names = [level.value for level in cls]
            raise UserInputError(
                f"level {value!r} is not one of {names}",
                "use one of those names (the lowest, 'ok', is no alarm)",
            ) from None

    @property
    def rank(self) -> int:
        """0 for ok up to 3 for critical."""
        return _RANK[self]

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def _other_rank(self, other: object) -> int:
        if isinstance(other, str):
            return Level.parse(other).rank
        return NotImplemented

    def __lt__(self, other: object) -> bool:
        rank = self._other_rank(other)
        return rank if rank is NotImplemented else self.rank < rank

    def __le__(self, other: object) -> bool:
        rank = self._other_rank(other)
        return rank if rank is NotImplemented else self.rank <= rank

    def __gt__(self, other: object) -> bool:
        rank = self._other_rank(other)
        return rank if rank is NotImplemented else self.rank > rank

    def __ge__(self, other: object) -> bool:
        rank = self._other_rank(other)
        return rank if rank is NotImplemented else self.rank >= rank

    __hash__ = str.__hash__


_RANK = {level: i for i, level in enumerate(Level)}
OK, WATCH, WARN, CRITICAL = Level.OK, Level.WATCH, Level.WARN, Level.CRITICAL
# the alarm levels, each with a threshold and a budget, lowest first
LEVELS: tuple[Level, ...] = (WATCH, WARN, CRITICAL)
# the levels a risk reading can have: below the lowest threshold (OK), or an alarm level
RISK_LEVELS: tuple[Level, ...] = (OK, *LEVELS)
# Dicts by level (thresholds, budgets, evidence) are keyed by the levels' names, plain
# strings: a Level key would print as its repr and sort by severity under json's
# sort_keys, which would change every stored model file and fingerprint.

# healthy steps between false alarms, per level (see the module docstring). warn: 2 per
# 10k, issue 34's bound for the levels as shipped; at 1 per 10k the cross-fitted level sat
# above most collapses (held-out families: 33-40 % of those that develop caught at 0.7 per
# 10k, against 52-55 % at 1.4-1.6 at this budget; benchmarks/README.md, "warn at 1 per 5,000")
DEFAULT_BUDGETS: dict[str, int] = {"watch": 1_000, "warn": 5_000, "critical": 100_000}

# Runs hold a budget with up to twice the false alarms it expects on their healthy steps:
# false alarms are rare events, and on a few thousand steps one more or less doubles a rate
BUDGET_FACTOR = 2.0


def per_10k(budget_steps: float) -> float:
    """A budget of one false alarm per ``budget_steps`` healthy steps, as false alarms per
    10,000 healthy steps (the rate tables and MLflow metrics show)."""
    return 1e4 / float(budget_steps)


def allowed_false_alarms(healthy_steps: int, budget_steps: float) -> int:
    """The one budget rule: the most false alarms ``healthy_steps`` healthy steps may raise
    and still hold a budget of one per ``budget_steps``.

    ``BUDGET_FACTOR`` times the count the budget expects, and never fewer than one: on
    fewer healthy steps than the budget, a single false alarm says nothing against it
    (4,000 steps at a 10,000-step budget expect 0.4; one is allowed, two are not).
    """
    return max(1, math.floor(BUDGET_FACTOR * healthy_steps / float(budget_steps)))


class ThresholdError(ValueError):
    """Thresholds no model may alarm with; the message names the field and what it got."""


def valid_level(threshold: float) -> float:
    """``threshold`` moved into (0, 1], the range a stored level must lie in.

    Above every healthy risk of 1 (or a measured +inf) no probability can stay silent: the
    level stops at 1, so those steps alarm and the evaluation counts them. At or under 0
    (no step ever scored) every level is silent; the least positive number stands for it.
    """
    return float(min(max(threshold, np.finfo(np.float64).tiny), 1.0))


def check_thresholds(values: object) -> dict[str, float]:
    """``values`` as a model's levels, else a :class:`ThresholdError` naming the field.

    The one rule for levels, wherever they come from (a model file, a service's answer): a
    mapping of exactly the level names to numbers (not a bool, not a string), finite and
    in (0, 1], ``watch <= warn <= critical``. At NaN, inf or above 1 no probability reaches
    a level (its alarm is off), at 0 or below every one does (always on); 1 fires only at
    certainty (a model meant never to alarm, e.g. a first champion).
    """
    names = [level.value for level in LEVELS]
    if not isinstance(values, Mapping) or set(values) != set(names):
        got = sorted(map(str, values)) if isinstance(values, Mapping) else values
        raise ThresholdError(f"'thresholds' must name exactly {names}; got {got!r}")
    levels: dict[str, float] = {}
    for name in names:
        value = values[name]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ThresholdError(
                f"thresholds.{name} must be a number in (0, 1]; got "
                f"{type(value).__name__} {value!r}"
            )
        if not (math.isfinite(value) and 0.0 < value <= 1.0):
            fires = "always fire" if value <= 0.0 else "never fire"
            raise ThresholdError(
                f"thresholds.{name} must be a finite probability in (0, 1]; got {value!r} "
                f"(its alarm would {fires})"
            )
        levels[name] = float(value)
    for low, high in itertools.pairwise(names):
        if levels[low] > levels[high]:
            raise ThresholdError(
                f"thresholds out of order: {low} {levels[low]!r} > {high} {levels[high]!r}; "
                "expected watch <= warn <= critical"
            )
    return levels


def thresholds_or_none(values: object) -> dict[str, float] | None:
    """:func:`check_thresholds` for a reader that falls back rather than fails (the guard
    reading a service's levels): the levels, or None when they break the rule."""
    try:
        return check_thresholds(values)
    except ThresholdError:
        return None


def _clean(scores: np.ndarray) -> np.ndarray:
    # NaN means "no score at this step" (e.g. a rule still warming up): never an alarm
    s = np.asarray(scores, dtype=np.float64)
    return np.where(np.isnan(s), -np.inf, s)


def alarm_starts(scores: np.ndarray, threshold: float) -> np.ndarray:
    """Indices where an alarm episode starts: score >= threshold after a step below it."""
    over = _clean(scores) >= threshold
    prev = np.concatenate(([False], over[:-1]))
    return np.flatnonzero(over & ~prev)


def _episode_intervals(sequences: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    # Step i starts an episode at threshold t exactly when prev_i < t <= s_i (the
    # previous step, or -inf at a run's start). Storing (prev_i, s_i) for every step
    # lets one sorted search count episodes at many thresholds at once.
    lows, highs = [], []
    for seq in sequences:
        s = _clean(seq)
        if s.size == 0:
            continue
        prev = np.concatenate(([-np.inf], s[:-1]))
        keep = s > prev
        lows.append(prev[keep])
        highs.append(s[keep])
    if not lows:
        return np.empty(0), np.empty(0)
    return np.sort(np.concatenate(lows)), np.sort(np.concatenate(highs))


def episode_counts(sequences: Sequence[np.ndarray], thresholds: np.ndarray) -> np.ndarray:
    """Number of alarm episodes (over all sequences) at each threshold.

    Each sequence is the per-step scores of one run (or one healthy stretch of it), in
    step order. An episode is a maximal stretch of consecutive steps with
    score >= threshold.
    """
    lows, highs = _episode_intervals(sequences)
    t = np.asarray(thresholds, dtype=np.float64)
    # count of i with low_i < t minus count with high_i < t = count with low_i < t <= high_i
    return np.searchsorted(lows, t, side="left") - np.searchsorted(highs, t, side="left")


def threshold_for_episodes(sequences: Sequence[np.ndarray], max_episodes: float) -> float:
    """Smallest threshold at which this and every higher threshold give <= max_episodes.

    Returns a value just above the highest score when even one episode is too many.
    """
    cleaned = [_clean(s) for s in sequences]
    values = np.concatenate([s[s > -np.inf] for s in cleaned]) if cleaned else np.empty(0)
    if values.size == 0:
        return 0.0  # nothing ever scores: any threshold is silent
    candidates = np.unique(values)  # ascending; +inf (a measured blow-up) included
    counts = episode_counts(cleaned, candidates)
    failing = np.flatnonzero(counts > max_episodes)
    if failing.size == 0:
        return float(candidates[0])
    last_fail = failing[-1]
    if last_fail + 1 < candidates.size:
        return float(candidates[last_fail + 1])
    # even the top score alarms too often: go above it (inf when +inf scores alarm
    # unavoidably; the evaluation then reports the rate that remains)
    return float(np.nextafter(candidates[-1], np.inf))


def thresholds_from_budgets(
    healthy_scores: Sequence[np.ndarray],
    budgets: Mapping[str, float] = DEFAULT_BUDGETS,
) -> dict[str, float]:
    """Thresholds per level so that false alarms on healthy runs stay within budget.

    ``healthy_scores``: per-step risks (probabilities) of each healthy validation run (every
    step). Each threshold is a valid stored level (:func:`valid_level`): at most 1.
    ``budgets``: level -> healthy steps between false alarms; must name exactly LEVELS,
    with budgets increasing from watch to critical.
    """
    if set(budgets) != set(LEVELS):
        names = [level.value for level in LEVELS]  # a list of Levels would print reprs
        raise ValueError(
            f"budgets must name exactly {names}; got {sorted(map(str, budgets))}. "
            f"Fix: pass e.g. {DEFAULT_BUDGETS}"
        )
    values = [float(budgets[level]) for level in LEVELS]
    if any(v <= 0 for v in values) or values != sorted(values):
        raise ValueError(
            f"budgets must be positive and increase from watch to critical; got {dict(budgets)}"
        )
    total_steps = sum(int(np.asarray(s).size) for s in healthy_scores)
    if total_steps == 0:
        # bad input, not a bug: the command line shows it as one line (a source of runs
        # that all collapsed has no healthy step to hold a budget on)
        raise UserInputError(
            "no healthy validation steps to set alarm thresholds on",
            "include healthy runs (onset_step null) of every source in the training data",
        )
    out: dict[str, float] = {}
    floor = -math.inf
    for level, budget in zip(LEVELS, values, strict=True):
        allowed = math.floor(total_steps / budget)
        # max() keeps the levels ordered even where ties make two budgets land together
        floor = max(floor, valid_level(threshold_for_episodes(healthy_scores, allowed)))
        out[level.value] = floor
    return out


def level_of(p: float, thresholds: Mapping[str, float]) -> Level:
    """OK, WATCH, WARN or CRITICAL: the highest level whose threshold p reaches."""
    if p is None or not math.isfinite(p):
        return OK
    current = OK
    for level in LEVELS:
        if p >= thresholds[level]:
            current = level
    return current


# ------------------------------------------------------------------ the run as the unit
def run_target(mean_steps: float, budget: float) -> float:
    """The chance a new run of ``mean_steps`` healthy steps may reach a level of ``budget``
    healthy steps between false alarms (module docstring); 1 or more: runs as long as the
    budget may each alarm, and the run bounds nothing (the steps' own rate does)."""
    return float(mean_steps) / float(budget)


def _beta_ppf(confidence: float, a: np.ndarray | float, b: np.ndarray | float) -> np.ndarray:
    from scipy.stats import beta

    return beta.ppf(confidence, a, b)


def exceedance_bound(alarmed: int, runs: int, confidence: float) -> float:
    """Upper ``confidence`` bound on a new run's chance to reach a level that ``alarmed`` of
    ``runs`` exchangeable healthy runs reached (distribution-free: order statistics)."""
    if alarmed >= runs:
        return 1.0
    return float(_beta_ppf(confidence, alarmed + 1, runs - alarmed))


def runs_needed(target: float, confidence: float) -> int:
    """Healthy runs, none of them reaching a level, that bound a new run's chance to reach
    it by ``target`` with ``confidence``: ``1 - (1 - c) ** (1 / K) <= target``."""
    if target >= 1.0:
        return 1
    return math.ceil(math.log1p(-confidence) / math.log1p(-target) - 1e-12)


def order_statistic_level(peaks: np.ndarray, target: float, confidence: float) -> float | None:
    """The lowest level whose :func:`exceedance_bound` over runs of highest risks ``peaks``
    is within ``target``: just above the r-th highest peak for the largest r that holds;
    None when even a level above every peak needs more runs (:func:`runs_needed`)."""
    peaks = np.sort(np.asarray(peaks, dtype=np.float64))[::-1]
    runs = peaks.size
    alarmed = np.arange(runs)  # a level just above the (j + 1)-th highest: j runs reach it
    held = _beta_ppf(confidence, alarmed + 1, runs - alarmed) <= target
    if runs == 0 or not held[0]:
        return None
    # the bound rises with j: the last j that holds is the lowest level
    j = int(np.flatnonzero(held)[-1])
    return float(np.nextafter(peaks[j], np.inf))
