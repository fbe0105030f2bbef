"""Each baseline pinned to its original's rule on a constructed trace.

Expected alarm steps are derived by hand in the comments, from the originals' code:
OLMo-core src/olmo_core/optim/skip_step_optimizer.py, ZClip zclip/zclip.py,
llm-foundry llmfoundry/callbacks/kill_loss_spike_callback.py, and the seed's DSI.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from collapse_guard.predictor.evaluate import Scorer
from collapse_guard.predictor.evaluate.baselines import (
    LEARNED_BASELINES,
    RULE_BASELINES,
    AttnEntropyThreshold,
    AttnLogitThreshold,
    ConfigOnlyBaseline,
    DSIBaseline,
    KillLossSpikeBaseline,
    OLMoZScoreBaseline,
    ZClipBaseline,
    default_baselines,
    sampled,
)
from collapse_guard.runfiles import RunMeta
from collapse_guard.runfiles.records import RunRecord


def _frame(n=400, **cols):
    return pd.DataFrame({"step": np.arange(n), **cols})


def _alarm_steps(alarms):
    return np.flatnonzero(alarms).tolist()


def _first(alarms):
    steps = _alarm_steps(alarms)
    return steps[0] if steps else None


# ------------------------------------------------------------------------------ DSI


def test_dsi_reads_each_signal_at_the_seeds_period_only():
    n = 400
    step = np.arange(n)
    grad_cv = np.where(step >= 130, 0.6, 0.2)  # measured every step; over from 130
    attn_kl = np.full(n, np.nan)
    attn_kl[::50] = np.where(step[::50] >= 150, 2.0, 0.5)  # every 50 steps; over from 150
    update_cos = np.where(step >= 105, 0.95, 0.5)  # every step; over from 105
    frame = _frame(n, grad_cv=grad_cv, attn_kl=attn_kl, update_cos=update_cos)
    # DSI reads grad_cv at 0, 100, 200 (over from the read at 200), attn_kl at 0, 50, ...
    # (over from 150), update_cos every 10 (over from 110): all three over from 200;
    # a rule reading every signal at every step would fire at 150
    alarms = DSIBaseline().alarm_run(frame)
    assert _first(alarms) == 200 and alarms[200:].all()
    # a grad_cv excursion between two reads (120-179) is never seen
    brief = np.where((step >= 120) & (step < 180), 0.6, 0.2)
    assert (
        not DSIBaseline()
        .alarm_run(_frame(n, grad_cv=brief, attn_kl=attn_kl, update_cos=update_cos))
        .any()
    )
    # below the band counts too: update_cos 0.05 is read at 0; attn_kl over from 150, grad_cv
    # read over at 200 when it rises at 130
    low_cos = _frame(n, grad_cv=grad_cv, attn_kl=attn_kl, update_cos=np.full(n, 0.05))
    assert _first(DSIBaseline().alarm_run(low_cos)) == 200
    # two of three over: never
    calm = _frame(n, grad_cv=grad_cv, attn_kl=attn_kl, update_cos=np.full(n, 0.5))
    assert not DSIBaseline().alarm_run(calm).any()


def test_a_periodic_read_takes_the_latest_measurement_of_its_period():
    values = np.full(200, np.nan)
    values[[25, 75, 130]] = [1.0, 2.0, 3.0]  # measured off the check steps
    got = sampled(_frame(200, x=values), "x", 50)
    # reads at 0 (nothing yet), 50 (25's 1.0), 100 (75's 2.0), 150 (130's 3.0)
    assert np.isnan(got[:50]).all()
    assert (got[50:100] == 1.0).all() and (got[100:150] == 2.0).all()
    assert (got[150:] == 3.0).all()


# ------------------------------------------------------------------------------ OLMo-core


def test_olmo_judges_from_its_64th_loss_at_six_unbiased_std():
    loss = np.r_[np.tile([2.0, 2.2], 32)[:63], np.full(37, 2.1)]
    prev = loss[:63]
    mean, std = prev.mean(), prev.std(ddof=1)  # torch.std_mean: unbiased
    b = OLMoZScoreBaseline()
    # row 63 is OLMo's 64th loss: max(2, 128 // 2) = 64 held, the current one included
    for k, fires in ((6.01, True), (5.99, False)):
        trace = loss.copy()
        trace[63] = mean + k * std
        frame = _frame(100, loss=trace)
        assert np.isnan(b.score_run(frame)[:63]).all() and np.isfinite(b.score_run(frame)[63])
        assert bool(b.alarm_run(frame)[63]) is fires
    # with the population std (ddof 0), 5.99 unbiased std would be 6.04 std: the
    # threshold above is the unbiased one
    assert 5.99 * std / prev.std(ddof=0) > 6


def test_olmo_skips_on_the_loss_or_the_gradient_norm_rising_only():
    rng = np.random.default_rng(0)
    loss = 2.5 + 0.01 * rng.standard_normal(400)
    grad = 1.0 + 0.01 * rng.standard_normal(400)
    loss[200] = 2.7  # ~20 std up: skipped
    loss[300] = 2.3  # a drop is not a reason to skip
    grad[250] = 1.2  # the gradient norm alone: skipped too
    b = OLMoZScoreBaseline()
    assert _alarm_steps(b.alarm_run(_frame(400, loss=loss, grad_norm=grad))) == [200, 250]
    assert _alarm_steps(b.alarm_run(_frame(400, loss=loss))) == [200]  # no grad norm logged


# ------------------------------------------------------------------------------ ZClip


def test_zclip_updates_its_ema_with_the_clipped_norm():
    warmup = [0.9, 1.1] * 12 + [1.0]  # mean 1.0, population var 0.0096 (std 0.09798)
    g = np.r_[warmup, 1.3, 1.27, 1.0, np.full(20, 1.0)]
    # step 25: z = 0.3 / (0.09798 + 1e-6) = 3.06 > 2.5: a spike; clipped to
    #   1.0 + 2.5^2 / 3.06 x 0.09798 = 1.2000; EMA mean 0.97 + 0.03 x 1.2 = 1.0060,
    #   var 0.97 x 0.0096 + 0.03 x (1.2 - 1.006)^2 = 0.010441
    # step 26: z = (1.27 - 1.0060) / (0.10218 + 1e-6) = 2.584 > 2.5: a spike (with the
    #   unclipped 1.3 in the EMA it would be 2.397: none)
    # step 27: 1.0 is below the mean: none
    b = ZClipBaseline()
    frame = _frame(g.size, grad_norm=g)
    z = b.score_run(frame)
    assert np.isnan(z[:25]).all()
    assert z[25] == pytest.approx(3.0618, abs=1e-4) and z[26] == pytest.approx(2.5836, abs=1e-4)
    assert _alarm_steps(b.alarm_run(frame)) == [25, 26]


def test_zclip_alarms_on_a_blow_up_but_not_on_an_amp_overflow():
    g = np.r_[[0.9, 1.1] * 12 + [1.0], np.full(20, 1.0)]
    g[30] = np.inf
    overflow = np.zeros(g.size)
    b = ZClipBaseline()
    assert _alarm_steps(b.alarm_run(_frame(g.size, grad_norm=g, overflow=overflow))) == [30]
    overflow[30] = 1
    assert not b.alarm_run(_frame(g.size, grad_norm=g, overflow=overflow)).any()


# ------------------------------------------------------------------------------ llm-foundry


def test_kill_loss_spike_fires_on_the_fifth_outlier_in_a_row():
    loss = np.full(400, 2.0)
    loss[150:154] = 5.0  # four outliers (>= 2 x 2.0): tolerated, patience 4
    loss[250:] = 5.0  # persistent: outliers 250..254, the fifth (counter 5 > 4) at 254
    assert _first(KillLossSpikeBaseline().alarm_run(_frame(400, loss=loss))) == 254


def test_kill_loss_spike_high_losses_use_the_cap_of_ten():
    # 10.5 from row 150: ratio 1.1, never a spike; the window of the 100 previous losses
    # holds >= 50 over the cap 10 once rows 150..199 are in it: row 200 (and Composer's
    # step 201 >= 2 x 100)
    loss = np.r_[np.full(150, 9.5), np.full(250, 10.5)]
    assert _first(KillLossSpikeBaseline().alarm_run(_frame(400, loss=loss))) == 200
    # 5 -> 8: llm-foundry means the cap to be the first window's largest loss (5) but
    # never sets it (module docstring), so the cap stays 10 and nothing fires
    calm = np.r_[np.full(150, 5.0), np.full(250, 8.0)]
    assert not KillLossSpikeBaseline().alarm_run(_frame(400, loss=calm)).any()


def test_kill_loss_spike_window_grows_with_a_long_run():
    # 3,000 steps: window max(100, 5% x 3000) = 150, first judged at row 150, whose window
    # (rows 0..149) has mean (100 x 2 + 50 x 5) / 150 = 3: 5.0 is no outlier (< 6), and
    # later windows are all 5s. A 100-row window would fire at 104.
    loss = np.r_[np.full(100, 2.0), np.full(2900, 5.0)]
    b = KillLossSpikeBaseline()
    assert b.window_for(3000) == 150
    assert not b.alarm_run(_frame(3000, loss=loss)).any()


def test_measured_nonfinite_is_an_alarm_for_loss_rules():
    loss = np.full(300, 2.0)
    loss[200] = np.nan
    flag = np.zeros(300)
    flag[200] = 1
    frame = _frame(300, loss=loss, loss_nonfinite=flag)
    for cls in (OLMoZScoreBaseline, KillLossSpikeBaseline):
        assert _first(cls().alarm_run(frame)) == 200, cls.__name__
    unmeasured = _frame(300, loss=loss)  # NaN without the flag: not measured, no alarm
    assert not OLMoZScoreBaseline().alarm_run(unmeasured).any()


@pytest.mark.parametrize("cls", RULE_BASELINES)
def test_rules_score_every_row_and_missing_signals_never_alarm(cls):
    b = cls()
    assert isinstance(b, Scorer)
    assert b.score_run(_frame(300)).shape == (300,)
    assert not b.alarm_run(_frame(300)).any()
    assert b.operating_points() == {}  # a rule has no tuned point: it fires as it fires


# ------------------------------------------------------------------------------ tuned


def _record(run_id, onset=None, n=1_000, **cols):
    return RunRecord(_frame(n, **cols), RunMeta(run_id=run_id, source="real", onset_step=onset))


def _sparse(values, n=1_000, period=50):
    out = np.full(n, np.nan)
    out[::period] = values
    return out


def test_single_signal_thresholds_are_tuned_on_validation_runs():
    rng = np.random.default_rng(3)
    validation = [
        _record(
            f"h{i}",
            attn_logit_max=_sparse(rng.uniform(10, 20, 20)),
            attn_entropy_min=_sparse(rng.uniform(0.5, 1.5, 20)),
        )
        for i in range(3)
    ]
    highest = max(np.nanmax(r.frame["attn_logit_max"]) for r in validation)
    lowest = min(np.nanmin(r.frame["attn_entropy_min"]) for r in validation)
    # 3,000 healthy steps allow 0.3 false alarms at 1 per 10k: none, so the threshold sits
    # just past the most extreme healthy reading
    logit = AttnLogitThreshold().fit((), validation, budget_per_10k=1.0)
    entropy = AttnEntropyThreshold().fit((), validation, budget_per_10k=1.0)
    assert logit.operating_points()["native"] == np.nextafter(highest, np.inf)
    assert entropy.operating_points()["native"] == np.nextafter(-lowest, np.inf)
    # on a test run the reading at step 600 (held until the next) crosses
    test_logit = _sparse(np.r_[np.full(12, 15.0), highest + 5, np.full(7, 15.0)])
    score = logit.score_run(_frame(1_000, attn_logit_max=test_logit))
    over = score >= logit.operating_points()["native"]
    assert _alarm_steps(over) == list(range(600, 650))
    assert default_baselines() and not any(
        isinstance(b, LEARNED_BASELINES) for b in default_baselines()
    )  # untuned, they have no operating point: left out without validation runs


def test_config_only_is_fitted_on_training_runs_and_tuned_on_validation(run_records):
    with pytest.raises(RuntimeError, match="not fitted"):
        ConfigOnlyBaseline().score_run(run_records[0].frame)
    b = ConfigOnlyBaseline().fit(run_records[:30], run_records[30:45])
    p = b.score_run(run_records[50].frame)
    assert p.shape == (len(run_records[50].frame),) and np.all((p >= 0) & (p <= 1))
    assert 0 < b.operating_points()["native"] <= 1
    names = [x.name for x in default_baselines(run_records[:30], run_records[30:45])]
    expected = ["dsi", "olmo_zscore", "zclip", "kill_spike", "attn_logit", "attn_entropy"]
    assert names == [*expected, "config_only"]


def test_config_only_is_total_on_a_warmup_from_zero_and_bad_lrs(run_records):
    # the transformers Trainer warms up from LR 0: a guarded run file has lr = 0 at step
    # 0; log10(0) = -inf made LightGBM refuse the rows ("Input X contains infinity")
    def bad_lr(run, k):
        frame = run.frame.copy()
        frame.loc[frame.index[0], "lr"] = 0.0
        frame.loc[frame.index[5], "lr"] = [-1e-3, np.inf, np.nan][k % 3]
        return RunRecord(frame, run.meta, run.path)

    runs = [bad_lr(run, k) for k, run in enumerate(run_records[:45])]
    b = ConfigOnlyBaseline().fit(runs[:30], runs[30:45])
    feats = b._features(runs[0].frame)
    # no LR yet has no logarithm (missing); the LR of step 1 onwards reads as before
    assert np.isnan(feats.loc[0, "log_lr"]) and np.isnan(feats.loc[0, "log_peak_lr"])
    assert feats.loc[1, "log_lr"] == np.log10(runs[0].frame["lr"].iloc[1])
    p = b.score_run(runs[31].frame)
    assert p.shape == (len(runs[31].frame),) and np.all((p >= 0) & (p <= 1))
