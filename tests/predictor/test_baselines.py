"""Each baseline on a constructed trace: when it fires, and that its score agrees."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from collapse_guard.predictor.baselines import (
    RULE_BASELINES,
    ConfigOnlyBaseline,
    DSIBaseline,
    KillLossSpikeBaseline,
    OLMoZScoreBaseline,
    ZClipBaseline,
    default_baselines,
)


def _frame(n=400, **cols):
    data = {"step": np.arange(n)}
    data.update(cols)
    return pd.DataFrame(data)


def _first(alarms):
    idx = np.flatnonzero(alarms)
    return int(idx[0]) if idx.size else None


def test_dsi_fires_only_when_all_three_are_over():
    n = 300
    grad_cv = np.where(np.arange(n) >= 50, 0.6, 0.2)
    attn_kl = np.full(n, np.nan)
    attn_kl[::50] = 0.5  # measured every 50 steps, inside the band
    attn_kl[100::50] = 2.0  # over from the probe at step 100 on
    update_cos = np.where(np.arange(n) >= 120, 0.95, 0.5)
    frame = _frame(n, grad_cv=grad_cv, attn_kl=attn_kl, update_cos=update_cos)
    alarms = DSIBaseline().alarm_run(frame)
    assert _first(alarms) == 120 and alarms[120:].all()
    two_of_three = _frame(n, grad_cv=grad_cv, attn_kl=attn_kl, update_cos=np.full(n, 0.5))
    assert not DSIBaseline().alarm_run(two_of_three).any()
    low_cos = _frame(n, grad_cv=grad_cv, attn_kl=attn_kl, update_cos=np.full(n, 0.05))
    assert _first(DSIBaseline().alarm_run(low_cos)) == 100  # below the band counts too


def test_olmo_zscore_fires_on_a_six_sigma_rise_only():
    rng = np.random.default_rng(0)
    loss = 2.5 + 0.01 * rng.standard_normal(400)
    loss[200] = 2.5 + 0.2  # ~20 sigma up
    loss[300] = 2.5 - 0.2  # a drop is not a reason to skip
    scores = OLMoZScoreBaseline().score_run(_frame(400, loss=loss))
    assert np.isnan(scores[:64]).all()  # OLMo judges from 64 losses on
    assert np.flatnonzero(OLMoZScoreBaseline().alarm_run(_frame(400, loss=loss))).tolist() == [200]


def test_zclip_fires_on_a_grad_norm_spike_after_warmup():
    rng = np.random.default_rng(1)
    g = 1.0 + 0.05 * rng.standard_normal(300)
    g[10] = 50.0  # inside the warm-up: only sets statistics, never alarms
    g[150] = 5.0
    b = ZClipBaseline()
    frame = _frame(300, grad_norm=g)
    assert np.isnan(b.score_run(frame)[:25]).all()
    assert 150 in np.flatnonzero(b.alarm_run(frame)).tolist()
    assert not b.alarm_run(frame)[26:150].any()
    g[200] = np.inf  # a blow-up alarms; the same inf on an AMP overflow step does not
    overflow = np.zeros(300)
    assert b.alarm_run(_frame(300, grad_norm=g, overflow=overflow))[200]
    overflow[200] = 1
    assert not b.alarm_run(_frame(300, grad_norm=g, overflow=overflow))[200]


def test_kill_loss_spike_needs_five_outliers_in_a_row():
    loss = np.full(400, 2.0)
    loss[150:154] = 5.0  # four outliers: tolerated (patience 4)
    loss[250:] = 5.0  # persistent
    alarms = KillLossSpikeBaseline().alarm_run(_frame(400, loss=loss))
    assert _first(alarms) == 254  # the fifth outlier in a row


def test_measured_nonfinite_is_an_alarm_for_loss_rules():
    loss = np.full(300, 2.0)
    loss[200] = np.nan
    flag = np.zeros(300)
    flag[200] = 1
    frame = _frame(300, loss=loss, loss_nonfinite=flag)
    assert OLMoZScoreBaseline().alarm_run(frame)[200]
    unmeasured = _frame(300, loss=loss)  # NaN without the flag: not measured, no alarm
    assert not OLMoZScoreBaseline().alarm_run(unmeasured).any()


@pytest.mark.parametrize("cls", RULE_BASELINES)
def test_scores_are_per_step_and_missing_signals_never_alarm(cls):
    frame = _frame(300)  # no signal columns at all
    b = cls()
    assert b.score_run(frame).shape == (300,)
    assert not b.alarm_run(frame).any()


def test_config_only_is_fitted_on_runs_and_gives_probabilities(run_records):
    with pytest.raises(RuntimeError, match="not fitted"):
        ConfigOnlyBaseline().score_run(run_records[0].frame)
    b = ConfigOnlyBaseline().fit(run_records[:30])
    p = b.score_run(run_records[40].frame)
    assert p.shape == (len(run_records[40].frame),)
    assert np.all((p >= 0) & (p <= 1))
    names = [x.name for x in default_baselines(run_records[:30])]
    assert names == ["dsi", "olmo_zscore", "zclip", "kill_spike", "config_only"]
