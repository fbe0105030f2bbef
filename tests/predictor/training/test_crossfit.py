"""Levels from cross-fitted scores: each family scored by a model that never saw it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from predictor_settings import FAST_PARAMS

from collapse_guard.predictor.core.calibration import Calibrator
from collapse_guard.predictor.core.levels import thresholds_from_budgets
from collapse_guard.predictor.training.crossfit import cross_fitted_scores
from collapse_guard.predictor.training.train import fit_and_level
from collapse_guard.runfiles import RunMeta
from collapse_guard.runfiles.records import RunRecord

BUDGETS = {"watch": 10, "warn": 100, "critical": 1000}


def _run(run_id: str, family: str | None, collapsed: bool, n: int = 50) -> RunRecord:
    frame = pd.DataFrame({"step": np.arange(n)})
    frame.attrs["family"] = family
    if family is None:
        meta = RunMeta(run_id=run_id, source="synthetic")
    else:
        meta = RunMeta(run_id=run_id, source="real", config={"family": family})
    return RunRecord(frame, dataclasses.replace(meta, onset_step=n // 2 if collapsed else None))


class _FamilyModel:
    """Scores 2.0 on a family it never trained on and 1.0 on one it did: the fitting is
    not under test here, which runs each fold trains on and scores is."""

    def __init__(self, train, val) -> None:
        self.seen = {r.meta.config.get("family") for r in [*train, *val]}

    def predict_run(self, frame, steps):
        return pd.Series(np.full(len(steps), 1.0 if frame.attrs["family"] in self.seen else 2.0))


def _runs():
    train = [
        _run(f"t-{family}-{i}", family, collapsed=i % 2 == 0)
        for family in ("gpt", "mha", "rope_swiglu", None)
        for i in range(4)
    ]
    val = [
        _run(f"v-{family}-{i}", family, collapsed=i == 0)
        for family in ("gpt", "mha", "rope_swiglu", None)
        for i in range(2)
    ]
    return train, val


def test_every_run_of_a_family_is_scored_by_a_model_fitted_without_that_family():
    train, val = _runs()
    folds = []

    def fit(tr, va):
        folds.append({r.meta.config.get("family") for r in [*tr, *va]})
        return _FamilyModel(tr, va)

    cross = cross_fitted_scores(train, val, fit)
    assert cross.fitted and cross.groups == ["gpt", "mha", "rope_swiglu"]
    # one fold per family, each without it; synthetic runs (family None) in every fold
    assert folds == [
        {"mha", "rope_swiglu", None},
        {"gpt", "rope_swiglu", None},
        {"gpt", "mha", None},
    ]
    # collapsing runs too: their steps before onset - horizon are healthy steps
    real = {r.run_id for r in [*train, *val] if r.meta.source == "real"}
    assert set(cross.scores) == real  # training and validation runs alike: 12 + 6
    assert len(real) == 18
    assert all((s == 2.0).all() for s in cross.scores.values())  # all out of family
    # synthetic runs are never held out: their validation runs are scored by the
    # shipped model, and the levels see them beside the cross-fitted ones
    synthetic = [r.run_id for r in cross.runs if r.meta.source == "synthetic"]
    assert synthetic == ["v-None-0", "v-None-1"]
    assert {r.run_id for r in cross.runs} == real | set(synthetic)


@pytest.mark.parametrize(
    ("drop", "reason"),
    [
        (
            ("mha", "rope_swiglu"),
            "1 family value(s) among the runs (synthetic runs have none); "
            "cross-fitting needs at least two",
        ),
        (("rope_swiglu",), "without family gpt: no collapsed validation run"),
    ],
)
def test_the_levels_fall_back_to_validation_runs_when_a_fold_cannot_be_fitted(drop, reason):
    train, val = _runs()
    train = [r for r in train if r.meta.config.get("family") not in drop]
    val = [r for r in val if r.meta.config.get("family") not in drop]
    if drop == ("rope_swiglu",):
        # the only collapsed validation runs are gpt's: without gpt, nothing to calibrate on
        val = [r for r in val if r.meta.config.get("family") == "gpt" or not r.collapsed]
    cross = cross_fitted_scores(train, val, fit=lambda tr, va: pytest.fail("no fold is fitted"))
    assert not cross.fitted and cross.reason == reason and not cross.scores


def test_a_fold_whose_collapses_give_no_positive_row_falls_back_too():
    # every fold has a collapsed validation run, but without gpt the rows hold no positive
    # (a collapse past the last window, say): the calibration's own error, not a crash
    train, val = _runs()

    def fit(train, val):
        if "gpt" not in {r.meta.config.get("family") for r in val}:
            Calibrator().fit(np.array([0.2, 0.4]), np.array([0, 0]))
        return _FamilyModel(train, val)

    cross = cross_fitted_scores(train, val, fit=fit)
    assert not cross.fitted and not cross.scores
    assert cross.reason.startswith("without family gpt: calibration needs both outcomes")


@pytest.fixture(scope="module")
def families(run_records):
    # the 60 synthetic runs, two thirds relabelled as real runs of two model families
    names = (None, "gpt", "rope_swiglu")
    out = []
    for i, r in enumerate(run_records):
        if names[i % 3] is not None:
            meta = dataclasses.replace(r.meta, source="real", config={"family": names[i % 3]})
            r = RunRecord(r.frame, meta, r.path)
        out.append(r)
    return out


def test_fit_and_level_sets_the_stored_levels_from_the_cross_fitted_scores(families):
    from collapse_guard.predictor.training.train import fit_risk_model

    train, val = families[::2], families[1::2]
    kwargs = {"stride": 25, "params": FAST_PARAMS}
    model = fit_and_level(train, val, budgets=BUDGETS, **kwargs)
    assert model.meta["levels_from"] == {
        "runs": "cross-fitted",
        "by": "family",
        "groups": ["gpt", "rope_swiglu"],
    }

    # the same levels from scratch: each family's runs scored by a model fitted without
    # it, each family holding the budget on its own; the synthetic source's validation
    # runs scored by the model; of each run its healthy steps (a collapsing run's before
    # onset - horizon)
    def healthy(m, r):
        steps = r.frame["step"].to_numpy()
        risk = m.predict_run(r.frame, steps=steps).to_numpy()
        return risk if r.meta.onset_step is None else risk[steps < r.meta.onset_step - 200]

    groups: dict[str, list[np.ndarray]] = {"gpt": [], "rope_swiglu": [], "synthetic": []}
    for family in ("gpt", "rope_swiglu"):
        without = [
            [r for r in part if r.meta.config.get("family") != family] for part in (train, val)
        ]
        fold = fit_risk_model(*without, **kwargs)[0]
        for r in [*train, *val]:
            if r.meta.config.get("family") == family:
                groups[family].append(healthy(fold, r))
    groups["synthetic"] = [healthy(model, r) for r in val if r.meta.source == "synthetic"]
    assert sum(r.collapsed for r in [*train, *val]) > 10  # collapsing runs are among them
    per_group = [thresholds_from_budgets(s, BUDGETS) for s in groups.values()]
    expected = {level: max(t[level] for t in per_group) for level in BUDGETS}
    assert model.thresholds == pytest.approx(expected, abs=0)
    # the families pooled give lower levels: each one on its own is the stricter rule
    pooled = thresholds_from_budgets(groups["gpt"] + groups["rope_swiglu"], BUDGETS)
    assert pooled["warn"] < model.thresholds["warn"]
    held = sum(map(len, (x for v in groups.values() for x in v)))
    assert model.meta["threshold_healthy_steps"] == held

    on_validation = fit_and_level(train, val, budgets=BUDGETS, levels_by=None, **kwargs)
    assert on_validation.meta["levels_from"] == {"runs": "validation"}
    assert on_validation.booster.model_to_string() == model.booster.model_to_string()  # one fit
    assert on_validation.thresholds != model.thresholds


def test_the_folds_build_each_runs_rows_once(families, monkeypatch):
    """Cross-fitting fits a model per family on the runs without it; each run's rows are
    built once for all folds (training.data.RowCache), the main fit's apart."""
    import collapse_guard.predictor.training.data as data

    built: list[str] = []

    def counting(runs, extractor, **kwargs):
        built.extend(r.run_id for r in runs)
        return data.build_training_data(runs, extractor, **kwargs)

    train, val = families[::2], families[1::2]
    model = fit_and_level(train, val, budgets=BUDGETS, stride=25, params=FAST_PARAMS, rows=counting)
    assert model.meta["levels_from"]["runs"] == "cross-fitted"
    runs = [r.run_id for r in [*train, *val]]
    # the main fit builds every run once, the two folds together once more (not twice)
    assert sorted(built) == sorted(runs + runs)
