"""Alarm levels that hold on a set-up the model never saw: cross-fitted scores.

Levels set on the healthy validation runs of the families a model trained on hold their
budget on those families, not on a new one. A user's run is a new set-up, and the model
scores it higher than the set-ups it knows (leave-one-family-out, the ``warn`` level set
on validation runs raised several times its budget on the held-out family: the figures
are in benchmarks/README.md, "Predictor: honest evaluation").

So the levels are set on what a new set-up looks like to the model. For each family
among the training runs, a model is fitted without it (the same pipeline and seed), and
that family's runs, training and validation alike, are scored by it. The thresholds are
then set on the healthy steps of these out-of-family scores (``train.set_levels``: all
of a healthy run, a collapsing one's before onset - horizon), each family holding the
budget on its own, as each source does. The shipped model is still the one fitted on
every training run; the fold models only score. Leave-one-family-out, ``warn`` then
comes closer to its budget on each held-out family, not always within it (figures:
benchmarks/README.md).

Synthetic runs have no family and are always trained on (``training.holdout``'s
rule); their source keeps the shipped model's scores on its validation runs.
Fewer than two families, or a family without which no model can be fitted and
calibrated (no collapsed run left in the training or validation part), and the levels
fall back to the validation runs alone; ``CrossFit.reason`` says why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from collapse_guard.predictor.core.calibration import CalibrationDataError
from collapse_guard.predictor.evaluate.groups import NEVER_HELD_OUT, held_out_group
from collapse_guard.predictor.evaluate.scorer import ModelScorer

__all__ = ["CrossFit", "cross_fitted_scores"]


@dataclass
class CrossFit:
    """Runs scored by models that never saw their group, or why there are none.

    ``runs``: the runs whose healthy steps set the levels (``train.set_levels``: all of a
    healthy run, a collapsing one's before onset - horizon): held-out groups' runs scored
    out of group, plus the never-held-out sources' validation runs;
    ``scores``: run id -> per-row scores for the runs scored out of group (the others
    are scored by the shipped model).
    """

    by: str
    groups: list[str] = field(default_factory=list)
    runs: list = field(default_factory=list)
    scores: dict[str, np.ndarray] = field(default_factory=dict)
    reason: str | None = None  # set when the levels fall back to the validation runs

    @property
    def fitted(self) -> bool:
        return self.reason is None


def _fold(runs: Sequence, group: dict[str, str], g: str) -> list:
    return [r for r in runs if group[r.run_id] != g]


def _unfittable(train: Sequence, val: Sequence) -> str | None:
    # what fit_risk_model needs: positives to fit on, and to calibrate on
    for part, runs in (("training", train), ("validation", val)):
        if not any(r.collapsed for r in runs):
            return f"no collapsed {part} run"
    return None


def cross_fitted_scores(
    train_runs: Sequence,
    val_runs: Sequence,
    fit: Callable[[list, list], object],
    *,
    by: str = "family",
) -> CrossFit:
    """Score each group's runs with a model ``fit`` without that group.

    ``fit(train, val)`` returns a fitted model (``RiskModel.predict_run``), no levels
    needed. Runs are ``RunRecord``s; groups are ``evaluate.groups.held_out_group``.
    """
    runs = [*train_runs, *val_runs]
    group = {r.run_id: held_out_group(r.meta, by) for r in runs}
    groups = sorted(set(group.values()) - set(NEVER_HELD_OUT))
    out = CrossFit(by=by, groups=groups)
    if len(groups) < 2:
        out.reason = (
            f"{len(groups)} {by} value(s) among the runs (synthetic runs have none); "
            "cross-fitting needs at least two"
        )
        return out
    folds = {g: (_fold(train_runs, group, g), _fold(val_runs, group, g)) for g in groups}
    for g, (train, val) in folds.items():
        if (why := _unfittable(train, val)) is not None:
            out.reason = f"without {by} {g}: {why}"
            return out
    models = {}
    for g, (train, val) in folds.items():
        try:
            models[g] = fit(train, val)
        except CalibrationDataError as error:  # collapsed runs, but no positive row among them
            out.reason = f"without {by} {g}: {error}"
            return out
    for g, model in models.items():
        scorer = ModelScorer(model)
        for run in runs:
            if group[run.run_id] == g:
                out.scores[run.run_id] = scorer.score_run(run.frame)
                out.runs.append(run)
    out.runs += [r for r in val_runs if group[r.run_id] in NEVER_HELD_OUT]
    return out
