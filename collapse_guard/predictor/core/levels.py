"""Alarm levels from false-alarm budgets.

A budget is the number of healthy steps the user accepts between two false alarms
(alibi-detect's "expected run time"): ``warn = 10_000`` means at most one false alarm
per 10,000 healthy steps. A false alarm is an alarm *episode*: consecutive steps at
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
warn      1 / 10,000 steps     act: tighten clipping, lower the LR
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
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence

import numpy as np

from collapse_guard.errors import UserInputError

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
    "alarm_starts",
    "allowed_false_alarms",
    "episode_counts",
    "level_of",
    "per_10k",
    "threshold_for_episodes",
    "thresholds_from_budgets",
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

# healthy steps between false alarms, per level (see the module docstring)
DEFAULT_BUDGETS: dict[str, int] = {"watch": 1_000, "warn": 10_000, "critical": 100_000}

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

    ``healthy_scores``: per-step scores of each healthy validation run (every step).
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
        floor = max(floor, threshold_for_episodes(healthy_scores, allowed))
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
