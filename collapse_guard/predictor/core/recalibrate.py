"""Levels set on a user's own healthy runs: the model kept, its alarm levels moved.

A model ranks the steps before a collapse well on set-ups it never saw, but its probability
scale shifts from one set-up to another, so levels set on the families it was trained on
can sit above every risk a new set-up gives (benchmarks/README.md, "Levels on your own
healthy runs"). False-alarm levels need only healthy runs, which every fleet has:
:func:`calibrate` keeps the booster, its probability calibration, horizon and hold, and
sets each level on the held risk the model gives the user's healthy runs.

>>> tuned = calibrate(RiskModel.load(), ["runs/healthy"])   # or RiskModel.calibrate(...)
>>> tuned.save("my-setup-model"); tuned.meta["levels_evidence"]["warn"]

How a level is set from few healthy runs: **the run is the unit**. A healthy run's highest
held risk comes once (the warmup's end, a re-warm: issue 34), so ``K`` runs are ``K``
samples of it however many steps they hold, and a new run passes the highest of them with
probability about ``1 / (K + 1)``. A level of budget ``B`` (healthy steps between false
alarms, :mod:`.levels`) over runs of ``L`` steps on average is a per-run target: a new run
may alarm with probability ``q = L / B`` (``levels.run_target``; at ``warn``, runs of 2,000
steps: 20 %). With ``c`` the confidence (default 0.9):

1. **Certified on runs** (``q < 1``): the lowest level just above one of the runs' peaks
   whose distribution-free bound holds: with ``j`` of ``K`` runs reaching it, a new run's
   chance is ``Beta(j + 1, K - j)``-distributed, whatever the law of peaks, and its
   ``c``-quantile must be at most ``q`` (``levels.order_statistic_level``). Takes at least
   ``log(1 - c) / log(1 - q)`` runs (``levels.runs_needed``: 11 at 20 %, 22 at 10 %).
   Where the steps certify the budget too (below), the level is at least theirs: their
   bound also counts a run that alarms more than once.
2. **Extrapolated from the peaks** with fewer runs: above every peak, at the level a new
   run's peak stays under with chance ``1 - q`` at confidence ``c`` were the peaks'
   log-odds Gumbel-distributed (the law of a maximum of many steps whose tail falls
   exponentially, as a logistic one does): mean + k sd of the peaks' log-odds, k the
   one-sided tolerance factor of the Gumbel pivot (:func:`gumbel_factor`; sd at least
   :data:`MIN_PEAK_SPREAD`). Exact for Gumbel peaks, conservative for lighter tails
   (normal, logistic: tests/predictor/core/test_run_bounds.py). One run has no spread:
   its steps' tail is read instead (3.). Recorded ``certified: false`` with the distribution-free
   bound the runs do give and the runs that would certify ``q``.
3. **On steps** (``q >= 1``, runs as long as the budget: ``watch`` on runs of 1,000 steps
   or more): with ``e`` episodes over ``N`` healthy steps, the exact one-sided Poisson
   bound (Garwood 1936) puts the rate below ``chi2.ppf(c, 2e + 2) / (2N)``. Certified: the
   lowest threshold at which that bound, and the bound at every higher threshold, is at
   most ``1/B`` (only with ``N >= B ln(1 / (1 - c))`` steps: :func:`steps_needed`).
   Else extrapolated: above every healthy risk, raised in log-odds by the decades of steps
   still missing, ``log10(needed / N)``, times the slope of the healthy risks' own upper
   tail (never under :data:`MIN_TAIL_SLOPE`). ``healthy_levels(..., unit="step")`` sets
   every level this way (before issue 34, ``calibrate`` did: it misjudged few runs).

Every level is a valid stored level, in (0, 1] (``levels.valid_level``), and each level's
``note`` says in one line what backs it (the command prints the uncertified ones).

Runs no healthy step can come from (empty, steps out of order, copies of another), runs
that collapsed and runs the model trained on are refused, each kind in one error naming the
runs (:mod:`.calibration_runs`; the model's validation runs are allowed: levels were set on
them before).
The result is a model version like any other: saved, loaded, served, registered in MLflow
(:func:`collapse_guard.predictor.lifecycle.registry.log_calibration`), taken by the guard; its
``version`` names its content (``<base version>-cal-<fingerprint>``) and its meta the runs
it was calibrated on (which the evaluation then refuses, as any model's validation runs).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol, TypeVar

import numpy as np
import pandas as pd
from scipy.stats import chi2

from collapse_guard.errors import UserInputError
from collapse_guard.predictor.core.calibration_runs import (
    RunsLike,
    calibration_records,
    refuse_unfit,
)
from collapse_guard.predictor.core.levels import (
    LEVELS,
    Level,
    episode_counts,
    exceedance_bound,
    order_statistic_level,
    run_target,
    runs_needed,
    valid_level,
)
from collapse_guard.predictor.core.seen_runs import SeenRuns, merged_ids, stored_ids


class _Model(Protocol):
    """What :func:`calibrate` reads of a ``RiskModel`` and hands its constructor. Not the
    class itself: ``RiskModel.calibrate`` imports this module, and naming the class here,
    even for type checkers only, would close an import circle."""

    booster: Any
    schema: Any
    calibrator: Any
    horizon: int
    hold_steps: int
    budgets: Mapping[str, float]
    meta: dict[str, Any]

    def predict_run(self, frame: pd.DataFrame, *, steps: Any = None) -> pd.Series: ...


Model = TypeVar("Model", bound=_Model)

__all__ = [
    "DEFAULT_CONFIDENCE",
    "MIN_PEAK_SPREAD",
    "MIN_TAIL_SLOPE",
    "UNITS",
    "LevelEvidence",
    "calibrate",
    "check_confidence",
    "gumbel_factor",
    "healthy_levels",
    "steps_needed",
    "tail_slope",
]

# One-sided confidence of the Poisson bound on the false-alarm rate: 0.9 is the usual
# choice for an operating level (0.95 asks 30 % more healthy steps for the same budget)
DEFAULT_CONFIDENCE = 0.9
# The least log-odds a level rises per decade of missing healthy steps. A tail read from
# few steps can look flat (one long plateau of held risk); 0.25 a decade is an exponential
# tail of log-odds scale 0.11 (0.25 / ln 10), flatter than every measured set-up's: 0.26-0.84
# (benchmarks/README.md, "Levels on your own healthy runs")
MIN_TAIL_SLOPE = 0.25
_TAIL_SHARE = 0.1  # the tail's slope is read from the top 10 % of healthy steps up
# The least spread (log-odds) of the runs' peaks an extrapolation reads: K runs that peak
# at one value (a plateau of held risk) do not make a new run's peak certain.
MIN_PEAK_SPREAD = 0.1
UNITS = ("run", "step")  # what healthy_levels takes as independent
# Draws of the Gumbel pivot (gumbel_factor): its 90 % quantile to about 1 %, in ~10 ms
_PIVOT_DRAWS = 20_000
_EPS = 1e-9  # log-odds of probabilities this close to 0 or 1 stay finite


@dataclass(frozen=True)
class LevelEvidence:
    """How one level was set: its threshold, and what backs it (module docstring)."""

    level: Level
    budget: float  # healthy steps between false alarms the level is set for
    threshold: float
    healthy_steps: int  # healthy steps of the calibration runs
    episodes: int  # alarm episodes at ``threshold`` on those steps
    certified: bool  # True: the bound of ``basis`` holds the budget; False: extrapolated
    steps_needed: int  # healthy steps that would certify the budget with no episode
    runs: int  # healthy calibration runs
    basis: str  # "runs" (a new run's chance to alarm) or "steps" (the rate over steps)
    run_target: float  # the chance a new run may alarm: mean run steps / budget
    alarmed_runs: int  # calibration runs whose held risk reaches ``threshold``
    expected_exceedance: float  # a new run's chance to reach it, in expectation
    exceedance_bound: float  # ... and its upper bound at the confidence asked
    runs_needed: int  # healthy runs, none reaching the level, that certify ``run_target``
    confidence: float

    @property
    def note(self) -> str:
        """What backs the level, in one line (the command prints it; the meta stores it)."""
        if self.basis == "steps":
            if self.certified:
                return f"{self.level}: certified on {self.healthy_steps:,} healthy steps"
            return (
                f"{self.level}: extrapolated from {self.healthy_steps:,} healthy steps; "
                f"{self.steps_needed:,} would certify it"
            )
        chance = (
            f"{_plural(self.runs, 'healthy run')} certify at most a "
            f"{_percent(self.exceedance_bound)} chance that a new run alarms "
            f"({_percent(self.confidence)} confidence; {_percent(self.expected_exceedance)} "
            "expected)"
        )
        if self.certified:
            return f"{self.level}: certified: {chance}, within its {_percent(self.run_target)}"
        more = max(self.runs_needed - self.runs, 1)
        return (
            f"{self.level}: not certified: {chance}; its budget, 1 false alarm per "
            f"{self.budget:,.0f} steps over runs of {self.healthy_steps / self.runs:,.0f} "
            f"steps, is a {_percent(self.run_target)} chance; "
            f"{_plural(more, 'more healthy run')}, "
            f"none reaching it, would certify that (the level is extrapolated above every "
            "run's peak)"
        )

    def to_dict(self) -> dict[str, Any]:
        # the name, as stored, and the note, for a reader of the meta without this code
        return {**asdict(self), "level": self.level.value, "note": self.note}


def _percent(share: float) -> str:
    # two figures: 9.9 % is no 10 % beside a 10 % budget
    return "100%" if share >= 0.995 else f"{100 * share:.2g}%"


def _plural(n: int, words: str) -> str:
    head, _, last = words.rpartition(" ")
    return f"{n} {head + ' ' if head else ''}{last}{'s' if n != 1 else ''}"


def steps_needed(budget: float, confidence: float = DEFAULT_CONFIDENCE) -> int:
    """Healthy steps with no false alarm that bound the rate under ``1/budget``."""
    return math.ceil(budget * -math.log1p(-confidence))


def _logit(p: np.ndarray | float) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), _EPS, 1.0 - _EPS)
    return np.log(p) - np.log1p(-p)


def _expit(z: float) -> float:
    return float(1.0 / (1.0 + math.exp(-z)))


def _rate_bounds(episodes: np.ndarray, steps: int, confidence: float) -> np.ndarray:
    return chi2.ppf(confidence, 2 * np.asarray(episodes) + 2) / (2 * steps)


def _certified(
    sequences: Sequence[np.ndarray], candidates: np.ndarray, rate: float, steps: int, c: float
) -> float | None:
    """The lowest candidate threshold whose Poisson bound, and every higher one's, holds."""
    held = _rate_bounds(episode_counts(sequences, candidates), steps, c) <= rate
    failing = np.flatnonzero(~held)
    if failing.size == 0:
        return float(candidates[0])
    if failing[-1] + 1 < candidates.size:
        return float(candidates[failing[-1] + 1])
    if _rate_bounds(0, steps, c) <= rate:  # above every healthy risk: no episode at all
        return float(np.nextafter(candidates[-1], np.inf))
    return None


def tail_slope(values: np.ndarray) -> float:
    """Log-odds per decade of exceedance of risks ``values``, from the top ``_TAIL_SHARE`` of
    steps to the highest one (the slope level extrapolation climbs at)."""
    values = np.asarray(values, dtype=np.float64)
    z = _logit(values[np.isfinite(values)])
    decades = math.log10(_TAIL_SHARE * z.size)
    if decades <= 0:
        return MIN_TAIL_SLOPE
    spread = float(z.max() - np.quantile(z, 1.0 - _TAIL_SHARE))
    return max(spread / decades, MIN_TAIL_SLOPE)


@functools.lru_cache(maxsize=256)
def gumbel_factor(runs: int, target: float, confidence: float) -> float:
    """``k`` such that mean + k sd of ``runs`` Gumbel draws lies above the law's ``1 - target``
    quantile with probability ``confidence``: a one-sided tolerance factor.

    ``(quantile - mean) / sd`` has one law for every location and scale (a pivot), so seeded
    draws of the standard law give it (:data:`_PIVOT_DRAWS`: about 1 % on ``k``).
    """
    draws = np.random.default_rng(0).gumbel(size=(_PIVOT_DRAWS, runs))
    quantile = -math.log(-math.log1p(-target))
    pivot = (quantile - draws.mean(axis=1)) / draws.std(axis=1, ddof=1)
    return float(np.quantile(pivot, confidence))


def _peak_extrapolation(peaks: np.ndarray, target: float, confidence: float) -> float:
    """A level a new run's peak stays under with chance ``1 - target``, at ``confidence``,
    were the log-odds of the runs' peaks Gumbel-distributed (module docstring)."""
    z = _logit(peaks)
    spread = max(float(z.std(ddof=1)), MIN_PEAK_SPREAD)
    return _expit(float(z.mean()) + gumbel_factor(z.size, target, confidence) * spread)


def check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise UserInputError(
            f"confidence must be in (0, 1), got {confidence}", "e.g. 0.9 (the default)"
        )


@dataclass(frozen=True)
class _Healthy:
    """The calibration runs' held risks, read once for every level."""

    sequences: list[np.ndarray]
    peaks: np.ndarray  # each run's highest held risk (-inf: no finite one)
    candidates: np.ndarray  # every distinct finite risk, rising
    slope: float  # the steps' tail slope (extrapolation on steps)
    steps: int

    @classmethod
    def of(cls, sequences: Sequence[np.ndarray]) -> _Healthy:
        cleaned = [np.asarray(s, dtype=np.float64) for s in sequences]
        finite = [s[np.isfinite(s)] for s in cleaned]
        values = np.concatenate(finite or [np.empty(0)])
        if values.size == 0:
            raise UserInputError(
                "the calibration runs have no scored healthy step",
                f"give runs of at least one risk window each (the model reads {len(cleaned)} "
                "runs with no finite risk)",
            )
        peaks = np.array([f.max() if f.size else -np.inf for f in finite])
        steps = int(sum(s.size for s in cleaned))
        return cls(cleaned, peaks, np.unique(values), tail_slope(values), steps)

    def step_extrapolation(self, needed: int) -> float:
        top = float(_logit(self.candidates[-1]))
        return _expit(top + self.slope * math.log10(needed / self.steps))

    def run_level(self, target: float, budget: float, confidence: float) -> float:
        """The runs' level for a per-run ``target`` (< 1): the order statistic where the
        runs certify it, else extrapolated from their peaks, above every one."""
        found = order_statistic_level(self.peaks, target, confidence)
        if found is not None:
            return found
        finite = self.peaks[np.isfinite(self.peaks)]
        if finite.size < 2:  # one peak has no spread: the steps' tail is all there is
            return self.step_extrapolation(steps_needed(budget, confidence))
        above = float(np.nextafter(finite.max(), np.inf))
        return max(above, _peak_extrapolation(finite, target, confidence))


def _threshold(
    healthy: _Healthy, budget: float, confidence: float, unit: str
) -> tuple[float, str, bool]:
    """A level's threshold before the levels below it floor it, its basis, and whether the
    steps' Poisson bound certifies it."""
    step_level = _certified(
        healthy.sequences, healthy.candidates, 1.0 / budget, healthy.steps, confidence
    )
    on_steps = step_level is not None
    target = run_target(healthy.steps / len(healthy.sequences), budget)
    if unit == "step" or target >= 1.0:  # runs as long as the budget: the steps' rate
        if step_level is None:
            step_level = healthy.step_extrapolation(steps_needed(budget, confidence))
        return step_level, "steps", on_steps
    run_level = healthy.run_level(target, budget, confidence)
    # the steps' Poisson bound, where it certifies, also counts a run's repeated episodes
    return max(run_level, step_level if on_steps else -math.inf), "runs", on_steps


def healthy_levels(
    sequences: Sequence[np.ndarray],
    budgets: Mapping[str, float],
    confidence: float = DEFAULT_CONFIDENCE,
    *,
    unit: str = "run",
) -> dict[str, LevelEvidence]:
    """Each level's threshold on per-step healthy risks (one array per run, step order).

    NaN (no risk yet) is never an alarm. Levels never fall from ``watch`` to ``critical``
    and are valid stored levels, in (0, 1]. ``unit="step"``: every level on the steps
    alone, as if they were independent (how levels were set before issue 34; kept to
    measure against, ``benchmarks/calibration_bound.py``).
    """
    check_confidence(confidence)
    if unit not in UNITS:
        raise UserInputError(f"unit must be one of {list(UNITS)}, got {unit!r}", "use 'run'")
    healthy = _Healthy.of(sequences)
    runs = len(healthy.sequences)
    out: dict[str, LevelEvidence] = {}
    floor = -math.inf
    for level in LEVELS:
        budget = float(budgets[level])
        threshold, basis, on_steps = _threshold(healthy, budget, confidence, unit)
        floor = valid_level(max(floor, threshold))
        (episodes,) = episode_counts(healthy.sequences, np.array([floor]))
        alarmed = int(np.count_nonzero(healthy.peaks >= floor))
        target = run_target(healthy.steps / runs, budget)
        bound = exceedance_bound(alarmed, runs, confidence)
        certified = bound <= target if basis == "runs" else on_steps
        out[level.value] = LevelEvidence(
            level,
            budget,
            floor,
            healthy.steps,
            int(episodes),
            bool(certified),
            steps_needed(budget, confidence),
            runs,
            basis,
            target,
            alarmed,
            (alarmed + 1) / (runs + 1),
            bound,
            runs_needed(target, confidence),
            confidence,
        )
    return out


def calibrate(
    model: Model,
    runs: RunsLike,
    *,
    budgets: Mapping[str, float] | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
) -> Model:
    """A copy of ``model`` whose levels hold their budgets on the healthy ``runs``.

    ``runs``: run files or folders of them, ``RunRecord``s or frames (``step`` + signals).
    ``budgets``: healthy steps between false alarms per level; default the model's own.
    Refuses empty runs, runs whose steps do not strictly increase, copies of another
    calibration run, runs that collapsed and runs the model trained on
    (:class:`UserInputError`, naming them). ``meta["levels_evidence"]`` says per level
    whether the budget is certified, a new run's bounded chance to alarm, how many healthy
    runs (or steps) would certify it, and a one-line ``note``.
    """
    check_confidence(confidence)  # before any run is read or scored
    records = calibration_records(runs)
    if not records:
        raise UserInputError(
            "no calibration runs given", "pass healthy run files of your set-up (--runs DIR)"
        )
    refuse_unfit(model, records)
    # at the recorded rows, as the evaluation scores a run (a row gap is no healthy step)
    risks = [model.predict_run(r.frame, steps=r.frame["step"].to_numpy()) for r in records]
    evidence = healthy_levels(
        [risk.to_numpy() for risk in risks], budgets or model.budgets, confidence
    )
    base = model.meta.get("base_version", model.meta["version"])
    ids = [r.run_id for r in records]
    meta = {
        **{k: v for k, v in model.meta.items() if k != "source"},
        "base_version": base,
        "calibrated_on": stored_ids(ids),
        # the levels were set on them: evaluation refuses them as any validation runs
        "validation_run_ids": merged_ids(SeenRuns.from_meta(model.meta).validation, ids),
        "levels_from": {"by": "calibrate", "runs": len(ids), "confidence": confidence},
        "levels_evidence": {level: e.to_dict() for level, e in evidence.items()},
        "threshold_healthy_steps": evidence[LEVELS[0]].healthy_steps,
    }
    tuned = type(model)(
        model.booster,
        model.schema,
        model.calibrator,
        {level: e.threshold for level, e in evidence.items()},
        horizon=model.horizon,
        budgets={level: e.budget for level, e in evidence.items()},
        hold_steps=model.hold_steps,
        meta=meta,
    )
    tuned.meta["version"] = f"{base}-cal-{tuned.fingerprint()[:8]}"
    return tuned
