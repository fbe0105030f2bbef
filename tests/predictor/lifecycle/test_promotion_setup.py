"""Promotion where the challenger will serve: levels and recall on the set-up's held-out runs,
the other set-ups' runs judging ranking only (promotion rule 5), and the new runs dealt so."""

from __future__ import annotations

import math

import pytest

from collapse_guard.predictor.lifecycle.promotion import (
    RANK_SLACK,
    RankScore,
    WarnScore,
    decide,
)
from collapse_guard.predictor.lifecycle.setup_runs import split_setup_runs
from collapse_guard.runfiles import RunMeta


def warn_score(version: str, caught: int, false_alarms: int = 0) -> WarnScore:
    # 4 held-out collapses and 4,000 healthy steps of the set-up, a 1-in-2,000 budget:
    # allowed_false_alarms = 2x the 2 expected = 4
    return WarnScore(version, 0.3, 2000.0, 8, 4, caught, false_alarms, 4000, 60.0)


def ranks(challenger: float, champion: float) -> tuple[RankScore, RankScore]:
    return RankScore("2", challenger, 12), RankScore("1", champion, 12)


def test_a_challenger_that_forgets_the_other_set_ups_is_kept_out():
    new, old = warn_score("2", caught=3), warn_score("1", caught=1)
    assert decide(new, old).promoted  # on the set-up alone it wins
    lost = decide(new, old, ranks(0.80, 0.80 + RANK_SLACK + 0.01))
    assert not lost.promoted and "ranks the other set-ups' runs worse" in lost.reason
    assert "v2: ROC-AUC 0.800" in lost.reason and "v1: ROC-AUC 0.860" in lost.reason


@pytest.mark.parametrize("challenger", [0.80 - RANK_SLACK + 0.001, 0.95, math.nan])
def test_ranking_within_the_slack_or_unmeasured_leaves_the_set_up_to_decide(challenger):
    decision = decide(warn_score("2", caught=3), warn_score("1", caught=1), ranks(challenger, 0.8))
    assert decision.promoted and "higher recall at warn" in decision.reason
    metrics = decision.to_metrics()
    assert metrics["compare.champion.ranking_roc_auc"] == 0.8
    assert metrics["compare.ranking_n_runs"] == 12.0


def test_levels_are_judged_on_the_set_up_whatever_the_ranking():
    over = warn_score("2", caught=4, false_alarms=5)  # 5 > 4 allowed on the set-up
    decision = decide(over, warn_score("1", caught=0), ranks(0.99, 0.5))
    assert not decision.promoted and "exceeds its warn false-alarm budget" in decision.reason


def meta(run_id: str, onset: int | None) -> RunMeta:
    return RunMeta(run_id=run_id, source="guarded", onset_step=onset, label_version="2")


def test_new_runs_are_dealt_into_held_out_and_calibration_runs_by_seed():
    metas = [meta(f"h{i}", None) for i in range(5)] + [meta(f"c{i}", 300) for i in range(3)]
    setup = split_setup_runs(metas, seed=3)
    held = set(setup.held_out)
    # half the healthy rounded down, half the collapsing rounded up; the rest healthy calibrate
    assert len({r for r in held if r.startswith("h")}) == 2
    assert len({r for r in held if r.startswith("c")}) == 2
    assert len(setup.calibration) == 3 and not held & set(setup.calibration)
    assert all(r.startswith("h") for r in setup.calibration)
    assert setup.apart == held | set(setup.calibration)  # the one collapse left trains
    # the same runs in another order, the same deal; another seed, another one
    assert split_setup_runs(metas[::-1], seed=3) == setup
    assert split_setup_runs(metas, seed=3, calibrate=False).calibration == ()
