"""Levels set on a user's own healthy runs: the model kept, its alarm levels moved.

A model ranks the steps before a collapse well on set-ups it never saw, but its probability
scale shifts from one set-up to another, so levels set on the families it was trained on
can sit above every risk a new set-up gives (benchmarks/README.md, "Levels on your own
healthy runs"). False-alarm levels need only healthy runs, which every fleet has:
:func:`calibrate` keeps the booster, its probability calibration, horizon and hold, and
sets each level on the held risk the model gives the user's healthy runs.

>>> tuned = calibrate(RiskModel.load(), ["runs/healthy"])   # or RiskModel.calibrate(...)
>>> tuned.save("my-setup-model"); tuned.meta["levels_evidence"]["warn"]

How a level is set from few healthy steps. A level of budget ``B`` (healthy steps between
false alarms, :mod:`.levels`) holds when alarm episodes come at a rate of at most ``1/B``
per healthy step. With ``e`` episodes over ``N`` healthy steps, the exact one-sided Poisson
bound (Garwood 1936) puts the rate below ``chi2.ppf(c, 2e + 2) / (2N)`` with confidence
``c`` (default 0.9). So:

1. **Certified**: the lowest threshold at which that bound, and the bound at every higher
   threshold, is at most ``1/B``. Only possible with ``N >= B ln(1 / (1 - c))`` healthy
   steps (zero episodes; :func:`steps_needed`): at c = 0.9, 2,303 for ``watch``, 23,026 for
   ``warn`` and 230,259 for ``critical``.
2. **Extrapolated** with fewer steps: the threshold just above every healthy risk, raised in
   log-odds by the decades of healthy steps still missing, ``log10(needed / N)``, times the
   slope of the healthy risks' own upper tail (log-odds per decade of exceedance, read from
   the top 10 % of healthy steps to the highest one; never under :data:`MIN_TAIL_SLOPE`).
   A logistic or exponential tail is a straight line on that scale. The level is recorded
   as ``certified: false`` with the steps that would certify it.

Runs that no healthy step can come from are refused, each kind in one error naming the
runs: a run with no rows, a run whose steps do not strictly increase (a step repeated or
going back; ``runfiles.records.check_steps``), and a copy of another calibration run (the
same ``runfiles.records.content_fingerprint``, whatever its file or run id: its steps are
the other's, counted twice, and 10,000 copies of one run would certify budgets that one
run cannot). Runs that collapsed are refused (a false-alarm level is set on healthy steps
only; a run without a label is labelled here by ``runfiles.label``), and so are runs the
model trained on (their risks are what the model learned, not what a new run will give;
its validation runs are allowed: levels were set on them before).
The result is a model version like any other: saved, loaded, served, registered in MLflow
(:func:`collapse_guard.predictor.lifecycle.registry.log_calibration`), taken by the guard; its
``version`` names its content (``<base version>-cal-<fingerprint>``) and its meta the runs
it was calibrated on (which the evaluation then refuses, as any model's validation runs).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import pandas as pd
from scipy.stats import chi2

from collapse_guard.errors import UserInputError
from collapse_guard.predictor.core.levels import LEVELS, Level, episode_counts
from collapse_guard.predictor.core.seen_runs import SeenRuns, merged_ids, stored_ids
from collapse_guard.runfiles import RunMeta
from collapse_guard.runfiles.label import label_run
from collapse_guard.runfiles.records import (
    RunRecord,
    check_steps,
    content_fingerprint,
    find_run_files,
    load_runs,
)


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
    "MIN_TAIL_SLOPE",
    "LevelEvidence",
    "calibrate",
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
_EPS = 1e-9  # log-odds of probabilities this close to 0 or 1 stay finite


@dataclass(frozen=True)
class LevelEvidence:
    """How one level was set: its threshold, and what backs it."""

    level: Level
    budget: float  # healthy steps between false alarms the level is set for
    threshold: float
    healthy_steps: int  # healthy steps of the calibration runs
    episodes: int  # alarm episodes at ``threshold`` on those steps
    certified: bool  # True: the Poisson bound holds the budget; False: extrapolated
    steps_needed: int  # healthy steps that would certify the budget with no episode

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "level": self.level.value}  # the name, as stored


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


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise UserInputError(
            f"confidence must be in (0, 1), got {confidence}", "e.g. 0.9 (the default)"
        )


def healthy_levels(
    sequences: Sequence[np.ndarray],
    budgets: Mapping[str, float],
    confidence: float = DEFAULT_CONFIDENCE,
) -> dict[str, LevelEvidence]:
    """Each level's threshold on per-step healthy risks (one array per run, step order).

    NaN (no risk yet) is never an alarm. Levels never fall from ``watch`` to ``critical``.
    """
    _check_confidence(confidence)
    cleaned = [np.asarray(s, dtype=np.float64) for s in sequences]
    values = np.concatenate([s[np.isfinite(s)] for s in cleaned] or [np.empty(0)])
    steps = int(sum(s.size for s in cleaned))
    if values.size == 0:
        raise UserInputError(
            "the calibration runs have no scored healthy step",
            f"give runs of at least one risk window each (the model reads {len(cleaned)} "
            "runs with no finite risk)",
        )
    candidates, slope = np.unique(values), tail_slope(values)
    out: dict[str, LevelEvidence] = {}
    floor = -math.inf
    for level in LEVELS:
        budget = float(budgets[level])
        needed = steps_needed(budget, confidence)
        threshold = _certified(cleaned, candidates, 1.0 / budget, steps, confidence)
        certified = threshold is not None
        if threshold is None:
            top = float(_logit(candidates[-1]))
            threshold = _expit(top + slope * math.log10(needed / steps))
        floor = max(floor, threshold)
        (episodes,) = episode_counts(cleaned, np.array([floor]))
        out[level.value] = LevelEvidence(
            level, budget, floor, steps, int(episodes), certified, needed
        )
    return out


RunsLike = Iterable[str | Path | RunRecord | pd.DataFrame] | Mapping[str, pd.DataFrame]


def _records(runs: RunsLike) -> list[RunRecord]:
    """Run files, folders of them, ``RunRecord``s, frames (``attrs["run_id"]`` names one), or
    ``{run_id: frame}``, as records (frames get a meta with no label: they are labelled)."""
    if isinstance(runs, Mapping):
        return [
            RunRecord(frame, RunMeta(str(run_id), "imported")) for run_id, frame in runs.items()
        ]
    records, paths = [], []
    for i, item in enumerate(runs):
        if isinstance(item, RunRecord):
            records.append(item)
        elif isinstance(item, pd.DataFrame):
            run_id = str(item.attrs.get("run_id") or f"frame-{i}")
            records.append(RunRecord(item, RunMeta(run_id, "imported")))
        else:
            paths.append(item)
    return records + (load_runs(find_run_files(paths)) if paths else [])


def _named(record: RunRecord) -> str:
    return f"{record.run_id} ({record.path})" if record.path is not None else record.run_id


def _why_empty(record: RunRecord) -> str:
    censoring = record.meta.extra.get("censoring") or {}
    if censoring.get("rows_before"):  # a guarded run: its rows after the guard acted are out
        return (
            f"{_named(record)}: all {censoring['rows_before']} rows censored, the guard first "
            f"acted at step {censoring.get('first_intervention')}"
        )
    return _named(record)


def _refuse_empty(records: Sequence[RunRecord]) -> None:
    empty = [r for r in records if r.n_rows == 0]
    if empty:
        named = ", ".join(_why_empty(r) for r in empty[:5])
        raise UserInputError(
            f"{len(empty)} of {len(records)} calibration runs have no rows: {named}",
            "a run gives healthy steps through its rows only; remove the empty runs "
            "(or calibrate once they have trained)",
        )


def _refuse_copies(records: Sequence[RunRecord]) -> None:
    # a copy is no new healthy step: counted, it would certify budgets that one run cannot
    first: dict[str, RunRecord] = {}
    copies: list[tuple[RunRecord, RunRecord]] = []
    for record in records:
        original = first.setdefault(content_fingerprint(record.frame), record)
        if original is not record:
            copies.append((record, original))
    if copies:
        named = ", ".join(f"{_named(c)} is a copy of {_named(o)}" for c, o in copies[:5])
        raise UserInputError(
            f"{len(copies)} of {len(records)} calibration runs hold the same steps and signals "
            f"as another (the same content fingerprint): {named}",
            "remove the copy (keep one file of each run): its steps are no new healthy steps",
        )


def _refuse_unusable(records: Sequence[RunRecord]) -> None:
    """Runs no healthy step can come from: empty, steps out of order, copies."""
    _refuse_empty(records)
    for record in records:  # files were checked as read, before censoring; frames here
        check_steps(record.frame, f"calibration run {_named(record)}")
    _refuse_copies(records)


def _onset(record: RunRecord) -> int | None:
    if record.meta.onset_step is not None or record.meta.label_version is not None:
        return record.meta.onset_step
    return label_run(record.frame).onset_step  # unlabelled (a probe's or a guard's run)


def _refuse_collapsed(records: Sequence[RunRecord]) -> None:
    collapsed = [(r.run_id, step) for r in records if (step := _onset(r)) is not None]
    if collapsed:
        named = ", ".join(f"{run_id} (onset at step {step})" for run_id, step in collapsed[:5])
        raise UserInputError(
            f"{len(collapsed)} of {len(records)} calibration runs collapsed: {named}",
            "calibrate sets false-alarm levels on healthy runs only; pass runs that trained "
            "to their end without collapsing",
        )


def _refuse_trained_on(model: _Model, records: Sequence[RunRecord]) -> None:
    seen = SeenRuns.from_meta(model.meta)
    known = [r.run_id for r in records if seen.role_of(r.run_id) == "train"]
    if known:
        raise UserInputError(
            f"{len(known)} of {len(records)} calibration runs are among the runs model "
            f"{model.meta['version']} was trained on: {', '.join(known[:5])}",
            "calibrate on runs of your own set-up that the model never trained on; its risks "
            "on its own training runs are what it learned, not what a new run gives",
        )


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
    whether the budget is certified and how many healthy steps would certify it.
    """
    _check_confidence(confidence)  # before any run is read or scored
    records = _records(runs)
    if not records:
        raise UserInputError(
            "no calibration runs given", "pass healthy run files of your set-up (--runs DIR)"
        )
    _refuse_unusable(records)
    _refuse_collapsed(records)
    _refuse_trained_on(model, records)
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
