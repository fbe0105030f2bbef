"""The run as the unit of healthy peaks (issue 34, item 7): order-statistic bounds, the
Gumbel extrapolation, and levels that hold out of sample on runs drawn from a known law of
per-run peaks, where a new run's chance to alarm at a level is known exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest
from calibration_bound import hump_run  # benchmarks/: its runs of a known law of peaks
from scipy.stats import gumbel_r, logistic, norm

from collapse_guard.predictor.core.levels import (
    ThresholdError,
    check_thresholds,
    exceedance_bound,
    order_statistic_level,
    run_target,
    runs_needed,
    thresholds_from_budgets,
    thresholds_or_none,
    valid_level,
)
from collapse_guard.predictor.core.recalibrate import gumbel_factor, healthy_levels

# one-step runs: a run is its peak, and these budgets make per-run targets of 50, 20, 5 %
ONE_STEP_BUDGETS = {"watch": 2, "warn": 5, "critical": 20}
DRAWS = 200


def _expit(z):
    return 1.0 / (1.0 + np.exp(-np.asarray(z, dtype=np.float64)))


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def test_runs_needed_and_the_bound_are_the_order_statistics_of_k_runs():
    # none of K runs above a level: a new run's chance is Beta(1, K), its 90 % quantile
    # 1 - 0.1 ** (1 / K); <= 20 % from K = log(0.1) / log(0.8) = 10.3, so 11 runs
    assert exceedance_bound(0, 3, 0.9) == pytest.approx(1 - 0.1 ** (1 / 3))  # 0.536
    assert runs_needed(0.2, 0.9) == 11 and runs_needed(0.1, 0.9) == 22
    assert exceedance_bound(0, 11, 0.9) <= 0.2 < exceedance_bound(0, 10, 0.9)
    assert exceedance_bound(3, 3, 0.9) == 1.0 and runs_needed(1.5, 0.9) == 1
    assert run_target(2_000, 10_000) == 0.2


def test_the_level_is_just_above_the_highest_peak_the_bound_allows():
    peaks = np.linspace(0.01, 0.6, 60)[::-1]  # 60 runs, peaks 0.6 down to 0.01
    level = order_statistic_level(peaks, 0.2, 0.9)
    # j runs reach a level just above the (j + 1)-th peak: the largest j whose
    # Beta(j + 1, 60 - j) 90 % quantile is <= 0.2 is j = 7 (0.19 at j = 7, 0.21 at 8)
    bounds = [exceedance_bound(j, 60, 0.9) for j in (7, 8)]
    assert bounds[0] <= 0.2 < bounds[1]
    assert level == np.nextafter(peaks[7], np.inf)
    assert order_statistic_level(peaks[:10], 0.2, 0.9) is None  # 10 runs: 11 needed


def test_the_gumbel_factor_is_the_tolerance_pivot():
    # many runs: the factor tends to the standard Gumbel's 80 % quantile in sd units,
    # (-log(-log 0.8) - 0.5772) / (pi / sqrt 6) = 0.719
    assert gumbel_factor(2_000, 0.2, 0.9) == pytest.approx(0.719, abs=0.05)
    assert gumbel_factor(3, 0.2, 0.9) > gumbel_factor(10, 0.2, 0.9) > 0.719


def _held_out_within_target(law, runs: int, level: str, seed: int) -> float:
    """Share of DRAWS draws of ``runs`` one-step runs, peaks' log-odds from ``law``, whose
    ``level`` a new run (from the same law) reaches with at most its per-run target."""
    rng = np.random.default_rng(seed)
    within = 0
    for _ in range(DRAWS):
        peaks = [np.array([p]) for p in _expit(law.rvs(size=runs, random_state=rng))]
        evidence = healthy_levels(peaks, ONE_STEP_BUDGETS)[level]
        within += law.sf(_logit(evidence.threshold)) <= evidence.run_target
    return within / DRAWS


@pytest.mark.parametrize("runs", [3, 5, 10])
@pytest.mark.parametrize("law", [norm(-1.5, 0.4), logistic(-1.5, 0.3)], ids=["normal", "logistic"])
def test_few_runs_hold_the_budget_out_of_sample_in_nine_draws_of_ten(law, runs):
    # fewer runs than the 11 that certify 20 %: extrapolated from the peaks, which the
    # Gumbel model does conservatively for these lighter tails (2,000 draws: 0.94-0.96)
    assert _held_out_within_target(law, runs, "warn", seed=runs) >= 0.9


@pytest.mark.parametrize("runs", [30, 60])
@pytest.mark.parametrize("law", [norm(-1.5, 0.4), gumbel_r(-1.5, 0.3)], ids=["normal", "gumbel"])
def test_enough_runs_certify_whatever_the_law(law, runs):
    # the order statistic alone: distribution-free (2,000 draws: 0.99)
    assert _held_out_within_target(law, runs, "warn", seed=runs) >= 0.9
    peaks = [np.array([p]) for p in _expit(law.rvs(size=runs, random_state=1))]
    assert healthy_levels(peaks, ONE_STEP_BUDGETS)["warn"].certified


def test_gumbel_peaks_are_held_as_the_confidence_says():
    # the Gumbel model is exact here: 90 % expected; 2,000 draws give 0.90-0.92, and 200
    # draws fall under 0.85 with probability below 1 %
    assert _held_out_within_target(gumbel_r(-1.5, 0.3), 5, "warn", seed=5) >= 0.85


def test_steps_taken_as_independent_miss_the_budget_runs_hold_it():
    # 3 runs of 1,000 steps, warn (1 per 5,000 steps: a new run may alarm with 20 %):
    # extrapolating the steps' tail holds it in fewer than 85 % of draws, the runs' peaks
    # in 90 % or more
    law, budgets = norm(-1.5, 0.4), {"watch": 500, "warn": 5_000, "critical": 50_000}
    rng = np.random.default_rng(7)
    within = {"run": 0, "step": 0}
    for _ in range(DRAWS):
        runs = [hump_run(rng, z, steps=1_000) for z in law.rvs(size=3, random_state=rng)]
        for unit in within:
            evidence = healthy_levels(runs, budgets, unit=unit)["warn"]
            within[unit] += law.sf(_logit(evidence.threshold)) <= 0.2
    assert within["run"] / DRAWS >= 0.9
    assert within["step"] / DRAWS < 0.85


def test_an_uncertified_level_says_how_many_more_runs_certify_it():
    rng = np.random.default_rng(3)
    runs = [hump_run(rng, z, steps=2_000) for z in (-1.6, -1.4, -1.2)]
    warn = healthy_levels(runs, {"watch": 1_000, "warn": 10_000, "critical": 100_000})["warn"]
    assert not warn.certified and warn.basis == "runs" and warn.alarmed_runs == 0
    assert warn.threshold > _expit(-1.2)
    assert warn.expected_exceedance == 0.25 and warn.runs_needed == 11
    assert warn.note == (
        "warn: not certified: 3 healthy runs certify at most a 54% chance that a new run "
        "alarms (90% confidence; 25% expected); its budget, 1 false alarm per 10,000 steps "
        "over runs of 2,000 steps, is a 20% chance; 8 more healthy runs, none reaching it, "
        "would certify that (the level is extrapolated above every run's peak)"
    )
    assert warn.to_dict()["note"] == warn.note and warn.to_dict()["level"] == "warn"


def test_every_level_is_a_valid_stored_level():
    # healthy risks of exactly 1 (and a measured +inf) used to give a level above 1
    assert valid_level(np.nextafter(1.0, 2.0)) == 1.0 and valid_level(math.inf) == 1.0
    assert 0.0 < valid_level(0.0) < 1e-300
    th = thresholds_from_budgets(
        [np.r_[np.full(99, 0.2), 1.0]], {"watch": 1, "warn": 2, "critical": 500}
    )
    assert th["critical"] == 1.0
    assert check_thresholds(th) == th
    levels = healthy_levels(
        [np.r_[np.full(99, 0.2), 1.0]] * 1, {"watch": 1, "warn": 2, "critical": 500}
    )
    assert all(0.0 < e.threshold <= 1.0 for e in levels.values())


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"critical": 1.5}, r"thresholds.critical must be a finite probability in \(0, 1\]; "
                            r"got 1.5 \(its alarm would never fire\)"),
        ({"watch": 0.0}, r"thresholds.watch .* got 0.0 \(its alarm would always fire\)"),
        ({"warn": "0.5"}, r"thresholds.warn must be a number in \(0, 1\]; got str '0.5'"),
        ({"warn": True}, r"thresholds.warn must be a number"),
        ({"watch": 0.9}, r"out of order: watch 0.9 > warn 0.5"),
    ],
)  # fmt: skip
def test_one_rule_for_levels_wherever_they_are_read(bad, message):
    good = {"watch": 0.1, "warn": 0.5, "critical": 1.0}  # 1: fires only at certainty
    assert check_thresholds(good) == good == thresholds_or_none(good)
    with pytest.raises(ThresholdError, match=message):
        check_thresholds({**good, **bad})
    assert thresholds_or_none({**good, **bad}) is None
    assert thresholds_or_none({"watch": 0.1}) is None and thresholds_or_none(None) is None
