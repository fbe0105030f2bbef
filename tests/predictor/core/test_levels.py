"""Alarm levels from false-alarm budgets, including alibi-detect-style statistical tests."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from collapse_guard.errors import UserInputError
from collapse_guard.predictor.core.levels import (
    DEFAULT_BUDGETS,
    alarm_starts,
    allowed_false_alarms,
    episode_counts,
    level_of,
    per_10k,
    threshold_for_episodes,
    thresholds_from_budgets,
)


def _brute_episodes(seqs, t):
    return sum(len(alarm_starts(s, t)) for s in seqs)


def test_alarm_starts_counts_episodes_not_steps():
    s = np.array([0.1, 0.9, 0.95, 0.2, 0.8, np.nan, 0.9])
    assert alarm_starts(s, 0.5).tolist() == [1, 4, 6]  # NaN ends an episode, never alarms


def test_episode_counts_match_brute_force():
    rng = np.random.default_rng(0)
    seqs = [rng.random(rng.integers(1, 60)) for _ in range(20)]
    seqs[3][5] = np.nan
    grid = np.linspace(-0.1, 1.1, 97)
    expected = [_brute_episodes(seqs, t) for t in grid]
    assert episode_counts(seqs, grid).tolist() == expected


def test_threshold_is_lowest_with_every_higher_threshold_within_budget():
    rng = np.random.default_rng(1)
    seqs = [np.convolve(rng.random(300), np.ones(5) / 5, "same") for _ in range(10)]
    for allowed in (0, 1, 3, 10):
        t = threshold_for_episodes(seqs, allowed)
        values = np.unique(np.concatenate(seqs))
        higher = values[values >= t]
        assert all(_brute_episodes(seqs, v) <= allowed for v in higher)
        lower = values[values < t]
        if lower.size:
            assert _brute_episodes(seqs, lower[-1]) > allowed
    top = threshold_for_episodes(seqs, 0)
    assert top > max(s.max() for s in seqs)


def test_thresholds_are_ordered_and_budgets_validated():
    rng = np.random.default_rng(2)
    seqs = [rng.random(5_000) for _ in range(40)]  # 200k healthy steps
    th = thresholds_from_budgets(seqs)
    assert th["watch"] <= th["warn"] <= th["critical"]
    with pytest.raises(ValueError, match="increase from watch to critical"):
        thresholds_from_budgets(seqs, {"watch": 10_000, "warn": 1_000, "critical": 100_000})
    with pytest.raises(ValueError, match="must name exactly"):
        thresholds_from_budgets(seqs, {"warn": 10})
    with pytest.raises(UserInputError, match="no healthy validation steps"):
        thresholds_from_budgets([], DEFAULT_BUDGETS)


def test_level_of():
    th = {"watch": 0.1, "warn": 0.3, "critical": 0.7}
    got = [level_of(p, th) for p in (0.0, 0.1, 0.29, 0.3, 0.9, float("nan"))]
    assert got == ["ok", "watch", "watch", "warn", "critical", "ok"]


def _ar1(rng, n, phi=0.9):
    # levels are stored probabilities, in (0, 1]: the process's log-odds as a risk
    return _expit(_ar1_logodds(rng, n, phi))


def _expit(z):
    return 1.0 / (1.0 + np.exp(-z))


def _ar1_logodds(rng, n, phi=0.9):
    # smooth healthy score process: alarms come in episodes, as real risk scores do
    e = rng.normal(size=n)
    x = np.empty(n)
    x[0] = e[0]
    for i in range(1, n):
        x[i] = phi * x[i - 1] + np.sqrt(1 - phi**2) * e[i]
    return x


def test_false_alarm_interval_on_fresh_healthy_runs_matches_budget():
    """alibi-detect style: calibrate on one healthy set, check the rate on another.

    With the `watch` budget of 1 per 1,000 steps, the mean interval between false
    alarms on fresh healthy runs lies within a factor 2 of 1,000 steps.
    """
    rng = np.random.default_rng(3)
    calib = [_ar1(rng, 2_000) for _ in range(100)]
    th = thresholds_from_budgets(calib, {"watch": 1_000, "warn": 5_000, "critical": 50_000})
    fresh = [_ar1(rng, 2_000) for _ in range(100)]
    episodes = _brute_episodes(fresh, th["watch"])
    interval = 200_000 / max(episodes, 1)
    assert 1_000 / 2 < interval < 1_000 * 2


def test_lead_time_on_rising_scores_exceeds_floor():
    """Runs whose score climbs over the 200 steps before onset alarm at `warn` >= 50 steps early."""
    rng = np.random.default_rng(4)
    th = thresholds_from_budgets([_ar1(rng, 2_000) for _ in range(100)])
    leads = []
    for _ in range(30):
        z = _ar1_logodds(rng, 1_000)
        z[800:] += np.linspace(0, 8, 200)  # onset at 1000
        s = _expit(z)
        first = next(i for i, v in itertools.chain(enumerate(s)) if v >= th["warn"] and i >= 800)
        leads.append(1_000 - first)
    assert np.mean(leads) > 50


def test_one_budget_rule_for_the_evaluation_and_promotion():
    """BudgetCheck.holds (evaluate) and WarnScore.within_budget (promotion) apply the same
    rule: twice the expected false alarms, at least one; they once disagreed on 4,000
    healthy steps with one false alarm at a 10,000-step budget."""
    from collapse_guard.predictor.evaluate.report import BudgetCheck
    from collapse_guard.predictor.lifecycle.promotion import WarnScore

    assert allowed_false_alarms(4_000, 10_000) == 1  # expects 0.4: one allowed, two not
    assert allowed_false_alarms(15_000, 10_000) == 3  # expects 1.5: floor(3.0)
    assert allowed_false_alarms(14_999, 10_000) == 2
    assert per_10k(10_000) == 1.0 and per_10k(1_000) == 10.0

    def both(healthy, false_alarms, budget=10_000):
        rate = 1e4 * false_alarms / healthy
        check = BudgetCheck("all", "warn", budget, rate, false_alarms, healthy)
        score = WarnScore("v", 0.5, budget, 10, 2, 1, false_alarms, healthy, 50.0)
        return check.holds, score.within_budget

    assert both(4_000, 1) == (True, True) and both(4_000, 2) == (False, False)
    assert both(4_000, 0) == (None, True)  # too few steps to tell; nothing against it
    for healthy, fa, budget in itertools.product(
        (500, 4_000, 9_999, 20_000, 123_457), range(8), (1_000, 10_000)
    ):
        holds, within = both(healthy, fa, budget)
        assert holds is None or holds == within, (healthy, fa, budget)
