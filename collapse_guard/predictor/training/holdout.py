"""Leave-one-group-out: train without a model family (optimizer, data), test on it.

The headline of docs/design.md, "Predictor", is measured on set-ups the model never saw. For
each value ``g`` of a set-up grouping (``groups.setup_of``: ``family``, ``optimizer``
or ``data``) among the runs:

1. the runs of ``g`` are the test runs; every other run is split by run into train and
   validation (``training.data.split_runs``, stratified by outcome and source, seeded);
2. a model is fitted on train, calibrated on validation, and its levels set exactly as
   ``train_risk_model`` sets them (``fit_and_level``: cross-fitted by family among the
   training groups, ``predictor.training.crossfit``); the learned baselines are fitted and tuned
   on the same runs;
3. model and baselines are evaluated on the runs of ``g`` (``evaluate_runs``).

Synthetic runs have no family, optimizer or data of their own: they form the group
``synthetic`` (or ``unknown``), which is never held out and always trained on (pass
``synthetic=False`` to leave them out altogether). Imported runs are their own family
(``imported``): held out like any other, since no model trains on imported logs' set-ups.

The mean over held-out groups weighs every group equally: a family with few runs counts
as much as a big one, which is the question ("does it travel to a new family?").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pandas as pd

from collapse_guard.predictor.evaluate.baselines import default_baselines
from collapse_guard.predictor.evaluate.groups import (
    NEVER_HELD_OUT,
    SETUP_GROUPINGS,
    held_out_group,
)
from collapse_guard.predictor.evaluate.report import HEADLINE, EvalReport, evaluate_runs
from collapse_guard.predictor.training.config import TrainConfig
from collapse_guard.predictor.training.data import split_runs
from collapse_guard.predictor.training.train import fit_and_level  # steps 2-5, levels included

__all__ = ["HeldOut", "HoldoutReport", "leave_one_group_out", "train_validation_split"]

_FIGURES = ("recall", "median_lead", "fa_per_10k", "caught", "n_collapsed")


@dataclass(frozen=True)
class HeldOut:
    """One held-out group: its runs' ids and the evaluation of the model trained without it."""

    grouping: str
    group: str
    test_ids: tuple[str, ...]
    train_ids: tuple[str, ...]
    validation_ids: tuple[str, ...]
    report: EvalReport


@dataclass
class HoldoutReport:
    """Every held-out group of one grouping, and the mean over them."""

    grouping: str
    folds: list[HeldOut] = field(default_factory=list)

    def frame(self, source: str = "all", operating_point: str = HEADLINE) -> pd.DataFrame:
        """One row per (group, scorer) at each scorer's headline point (the model at its
        stored ``warn`` level, a rule as its original fires it, a tuned baseline at its
        validation threshold), then the rows ``mean`` (unweighted over groups).

        ``operating_point="budget"``: every scorer at the ROC-like point instead, a
        threshold fitted on the held-out group's runs for the evaluation's false-alarm
        budget (secondary: it compares scorers at one false-alarm rate).
        """
        rows = []
        for fold in self.folds:
            for scorer in fold.report.scorers:
                r = fold.report.result(scorer, source, operating_point)
                rows.append(
                    {
                        "group": fold.group,
                        "scorer": scorer,
                        "operating_point": r.operating_point,
                        **{k: r.flat()[k] for k in _FIGURES},
                    }
                )
        frame = pd.DataFrame(rows, columns=["group", "scorer", "operating_point", *_FIGURES])
        if frame.empty:
            return frame
        mean = (
            frame.groupby("scorer", sort=False)[["recall", "median_lead", "fa_per_10k"]]
            .mean()  # NaN (a group without collapses) is skipped
            .reset_index()
        )
        mean["group"] = "mean"
        mean["operating_point"] = [
            frame.loc[frame["scorer"] == s, "operating_point"].iloc[0] for s in mean["scorer"]
        ]
        mean["caught"] = frame.groupby("scorer", sort=False)["caught"].sum().to_numpy()
        mean["n_collapsed"] = frame.groupby("scorer", sort=False)["n_collapsed"].sum().to_numpy()
        return pd.concat([frame, mean[frame.columns]], ignore_index=True)

    def wide(self, figure: str = "recall", operating_point: str = HEADLINE) -> pd.DataFrame:
        """One row per held-out group (and ``mean``), one column per scorer."""
        frame = self.frame(operating_point=operating_point)
        if frame.empty:
            return frame
        out = frame.pivot(index="group", columns="scorer", values=figure)
        order = [*dict.fromkeys(frame["group"])]
        return out.reindex(index=order, columns=[*dict.fromkeys(frame["scorer"])])

    def group_counts(self, grouping: str, scorer: str = "model") -> pd.DataFrame:
        """What ``scorer`` caught at its headline point, per group of ``grouping`` (e.g.
        ``onset``, ``cause``, ``optimizer``) and held-out group: one row per group, columns
        ``(held-out group, figure)`` and ``("all", figure)`` summed over held-out groups.
        Figures: ``caught``, ``n`` (the group's collapses), and for a set-up grouping
        (``optimizer``, ``data``: its runs, healthy ones included) ``false_alarms`` and
        ``healthy_steps``: where the false-alarm budget went."""
        figures = ["caught", "n"]
        if grouping in SETUP_GROUPINGS:
            figures += ["false_alarms", "healthy_steps"]
        rows = []
        for fold in self.folds:
            point = fold.report.headline_point(scorer)
            for g in fold.report.groups:
                if (g.scorer, g.source, g.operating_point) != (scorer, "all", point):
                    continue
                if g.result.grouping == grouping:
                    e = g.result.events
                    counts = (e.caught, e.n_collapsed, e.false_alarms, e.healthy_steps)
                    rows.append((fold.group, g.result.group, *counts[: len(figures)]))
        frame = pd.DataFrame(rows, columns=["held_out", grouping, *figures])
        wide = frame.pivot_table(
            index=grouping, columns="held_out", values=figures, aggfunc="sum"
        ).swaplevel(axis=1)
        held = [f.group for f in self.folds if f.group in set(frame["held_out"])]
        wide = wide.reindex(columns=pd.MultiIndex.from_product([held, figures]))
        for figure in figures:
            wide[("all", figure)] = frame.groupby(grouping)[figure].sum()
        return wide.fillna(0).astype(int)


def leave_one_group_out(
    runs: Sequence,
    config: TrainConfig | None = None,
    *,
    by: str = "family",
    synthetic: bool = True,
    validation_share: float = 0.25,
    baselines: bool = True,
    progress: Callable[[str], None] | None = None,
    **settings,
) -> HoldoutReport:
    """Train without each group of ``by``, evaluate on it (module docstring).

    ``runs``: ``RunRecord``s. ``config`` (``settings`` over it): each fold's training, as
    ``train_risk_model``'s (``levels_by`` cross-fitted within the training runs only, so
    the held-out group sets nothing; ``eval_budget_per_10k``: the ROC-like point).
    ``validation_share``: of the training runs, the share kept for early stopping,
    calibration, levels and the tuned baselines' thresholds.
    """
    config = TrainConfig.of(config, **settings)
    if by not in SETUP_GROUPINGS:
        raise ValueError(
            f"leave-one-out groups runs by one of {SETUP_GROUPINGS}; got {by!r}. "
            "Fix: e.g. --leave-one-out family"
        )
    if not synthetic:
        runs = [r for r in runs if r.meta.source != "synthetic"]
    # a synthetic run is training data whatever its config says (module docstring)
    group = {r.run_id: held_out_group(r.meta, by) for r in runs}
    held = sorted(set(group.values()) - set(NEVER_HELD_OUT))
    report = HoldoutReport(grouping=by)
    if not held or (len(held) < 2 and set(group.values()) <= set(held)):
        raise ValueError(
            f"leave-one-{by}-out needs runs of at least two {by} values, or one beside "
            f"synthetic runs to train on; got {held or 'none'} in {len(runs)} runs. "
            f"Fix: add runs of another {by}"
        )
    for g in held:
        test = [r for r in runs if group[r.run_id] == g]
        rest = [r for r in runs if group[r.run_id] != g]
        train, val = train_validation_split(rest, config.seed, validation_share)
        if progress is not None:
            progress(f"{by} {g}: train {len(train)}, validation {len(val)}, test {len(test)} runs")
        model = fit_and_level(train, val, config)
        budget, horizon = config.eval_budget_per_10k, config.horizon
        scorers = (
            default_baselines(train, val, horizon=horizon, budget_per_10k=budget, seed=config.seed)
            if baselines
            else []
        )
        fold = evaluate_runs(test, model, scorers, budget_per_10k=budget, horizon=horizon)
        report.folds.append(
            HeldOut(
                by,
                g,
                tuple(r.run_id for r in test),
                tuple(sorted(r.run_id for r in train)),
                tuple(sorted(r.run_id for r in val)),
                fold,
            )
        )
    return report


def train_validation_split(
    runs: Sequence, seed: int, validation_share: float = 0.25
) -> tuple[list, list]:
    """A fold's training runs split by run into training and validation (early stopping,
    calibration, levels), stratified as ``split_runs`` splits."""
    shares = (1 - validation_share, validation_share, 0)
    split = split_runs([r.meta for r in runs], seed=seed, fractions=shares)
    # split_runs deals every split a run of each stratum; there is no test split here
    train_ids, val_ids = set(split.train) | set(split.test), set(split.validation)
    return [r for r in runs if r.run_id in train_ids], [r for r in runs if r.run_id in val_ids]
