"""Synthetic runs without shortcuts (issue 8): every precursor synthetic collapses carry
also shows in synthetic healthy runs, as decoys that resolve, at a comparable rate; no
single signal's window statistic separates collapsing from healthy synthetic runs well;
and the decoys leave healthy runs healthy under the label."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from scipy.stats import rankdata

from collapse_guard.datasets.synthetic import SamplerConfig, make_frame, sample_spec
from collapse_guard.datasets.synthetic.shapes import make_shapes
from collapse_guard.datasets.synthetic.shortcuts import (
    LOG_SIGNALS,
    WINDOW,
    auroc,
    block_medians,
    draw_sample,
    precursor_rates,
    separation_table,
    window_stats,
)
from collapse_guard.datasets.synthetic.spec import Decoy

# A healthy run shows a precursor at between half and twice the collapses' rate
# (issue 8 asks for "a comparable rate"; 200 runs hold ~85 collapses, so a rate of
# 0.3 has a standard error of ~0.05 and 2x is well outside the noise).
RATE_FACTOR = (0.5, 2.0)
# A detector's threshold lets 10% of decoy-free healthy runs through (shortcuts.PRECURSORS):
# a precursor seen in fewer than 15% of collapses is mostly that noise, and its rate
# ratio says nothing. Those rows are reported, not judged.
DETECTABLE = 0.15
# Largest folded AUROC any single signal's window statistic (drift, curvature) may
# reach between the collapses' last window before onset and a healthy run's window at
# a matched place. Before the decoys param_norm reached 0.78 (400 runs of seed 0) and
# update_ratio 0.74; now the largest is the attention logit's curvature, 0.68 on 400
# runs and 0.73 on this test's 200: the one precursor real runs are known to carry
# strongly (issue 8: a tuned threshold on it catches about half of the real collapses).
MAX_AUROC = 0.75


@pytest.fixture(scope="module")
def sample():
    """200 runs of seed 0 (~85 collapses), a few seconds."""
    return draw_sample(200, seed=0)


def test_healthy_runs_show_each_precursor_about_as_often_as_collapses(sample):
    rates = precursor_rates(sample)
    print("\n" + rates.to_string())
    judged = rates[rates.collapsing >= DETECTABLE]
    # the detectors see the precursors: at least these, of three families
    assert {"output-logit growth", "update reversals", "update_cos fall (DSI)"} <= set(
        judged.precursor
    ), rates.to_string()
    lo, hi = RATE_FACTOR
    off = judged[(judged.ratio < lo) | (judged.ratio > hi)]
    assert off.empty, f"healthy/collapsing rate outside {RATE_FACTOR}:\n{off.to_string()}"


def test_without_decoys_the_rate_check_fails():
    """The check can fail: the generator without decoys is the one issue 8 measured."""
    runs = draw_sample(120, seed=0, config=SamplerConfig(decoy_share=0.0))
    rates = precursor_rates(runs).set_index("precursor")
    assert rates.loc["output-logit growth", "ratio"] < RATE_FACTOR[0], rates.to_string()
    assert rates.loc["update reversals", "ratio"] < RATE_FACTOR[0], rates.to_string()


def test_no_single_signal_separates_collapsing_from_healthy_runs(sample):
    table = separation_table(sample)
    print("\n" + table.to_string())
    bounded = table[~table.exempt]
    every_run = bounded[~bounded.signal.isin(["loss_scale", "overflow"])]  # AMP runs only
    assert (every_run.n_collapsed >= 50).all(), every_run.to_string()
    assert set(LOG_SIGNALS) <= set(bounded.signal)
    over = bounded[bounded.auroc >= MAX_AUROC]
    assert over.empty, f"single signals separating at AUROC >= {MAX_AUROC}:\n{over.to_string()}"


def test_a_planted_shortcut_is_caught(sample):
    """The AUROC check is not a rubber stamp: a param norm 5% higher over the last 50
    steps before every onset (a precursor no healthy run has) fails it."""
    planted = []
    for run in sample:
        if run.onset is not None:
            norm = run.signals["param_norm"].copy()
            norm[run.onset - 50 : run.onset] += math.log10(1.05)
            run = replace(run, signals={**run.signals, "param_norm": norm})
        planted.append(run)
    table = separation_table(planted).set_index(["signal", "stat"])
    assert table.loc[("param_norm", "curvature"), "auroc"] >= MAX_AUROC, table.to_string()


def test_decoys_stay_healthy_under_the_label(sample):
    with_decoys = [r for r in sample if r.kind == "healthy" and r.decoys]
    assert len(with_decoys) >= 0.7 * sum(r.kind == "healthy" for r in sample)
    assert all(r.onset is None for r in with_decoys), [r.decoys for r in with_decoys if r.onset]
    kinds = {k for r in with_decoys for k in r.decoys}
    assert kinds == {"attention_entropy", "nonfinite", "gradient_collapse", "oscillation"}


def test_a_decoy_is_the_collapse_precursor_then_resolves():
    """Before its peak a decoy's drift is a collapse's ``pre`` to the step; after, the
    returning shape fades and the kept one stays."""
    healthy = next(s for s in (sample_spec(i, 0) for i in range(50)) if s.kind == "healthy")
    collapse = next(s for s in (sample_spec(i, 0) for i in range(50)) if s.kind == "oscillation")
    peak, lead = 900, 200
    spec = replace(healthy, n_steps=2000, decoys=(Decoy("oscillation", peak, lead, fade=50.0),))
    t = np.arange(2000.0)
    rng = np.random.default_rng(0)
    decoy = make_shapes(spec, t, rng)
    real = make_shapes(replace(collapse, n_steps=2000, onset=peak, lead=lead), t, rng)
    before = t <= peak
    np.testing.assert_array_equal(decoy.drift["oscillation"][before], real.pre[before])
    assert decoy.drift["oscillation"][peak + 250] < 0.01  # 5 e-foldings later
    assert decoy.drift_kept["oscillation"][peak + 250] == 1.0
    assert not decoy.post.any() and not decoy.after.any()
    # and the frame shows it: updates flip around the peak, not before the ramp or late
    flips = make_frame(replace(spec, gaps=())).set_index("step")["update_flips"]
    assert flips.loc[peak - 20 : peak].mean() > 3 * max(flips.loc[200 : peak - lead].mean(), 0.5)
    assert flips.loc[peak + 400 :].mean() < 1.0


def test_window_statistics_by_hand():
    values = np.concatenate([np.zeros(100), np.arange(100.0)])  # flat, then a ramp
    blocks = block_medians(values, 200)
    np.testing.assert_allclose(blocks, [0.0, 0.0, 24.5, 74.5])
    drift, curvature = window_stats(blocks)
    assert drift.tolist() == [74.5] and curvature.tolist() == [50.0]  # (74.5-24.5)-(0-0)
    assert block_medians(np.concatenate([values, values[:30]]), 230).size == 4  # 30 dropped
    assert WINDOW == 200
    assert auroc([2.0, 3.0], [0.0, 1.0]) == 1.0 and auroc([1.0], [1.0]) == 0.5
    assert math.isnan(auroc([], [1.0]))


def test_auroc_is_the_former_rank_formula():
    """sklearn's ROC-AUC equals the Mann-Whitney rank formula used before, ties included."""
    rng = np.random.default_rng(3)
    for n_pos, n_neg in ((5, 40), (60, 60), (200, 17)):
        pos = np.round(rng.normal(0.4, 1.0, n_pos), 1)  # rounded: many ties
        neg = np.round(rng.normal(0.0, 1.0, n_neg), 1)
        ranks = rankdata(np.concatenate([pos, neg]))
        former = (ranks[:n_pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
        with_nan = np.r_[pos, np.nan]  # NaN is dropped
        assert math.isclose(auroc(with_nan, neg), former, rel_tol=1e-12)
