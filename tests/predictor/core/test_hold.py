"""The risk hold: the highest risk of the last hold_steps steps, one code path for a run
file and a live loop, and what it does to the levels and the alarms."""

from __future__ import annotations

import math

import numpy as np
import pytest

from collapse_guard.predictor.core.hold import RiskHold, hold_risk
from collapse_guard.predictor.core.levels import alarm_starts
from collapse_guard.predictor.evaluate.events import ScoredRun, event_metrics


def test_a_risk_is_held_for_exactly_hold_steps_steps():
    steps = np.arange(0, 90, 10)
    risk = np.array([0.1, 0.9, 0.2, 0.3, 0.1, 0.1, 0.05, 0.2, 0.1])
    held = hold_risk(steps, risk, 50)
    # 0.9 at step 10 holds through step 59: the window is (step - 50, step]
    np.testing.assert_array_equal(held, [0.1, 0.9, 0.9, 0.9, 0.9, 0.9, 0.3, 0.3, 0.2])
    np.testing.assert_array_equal(hold_risk(steps, risk, 0), risk)
    np.testing.assert_array_equal(hold_risk(steps, risk, 1), risk)


def test_nan_is_no_opinion_and_never_held():
    held = hold_risk([0, 1, 2, 3, 60], [math.nan, math.nan, 0.4, math.nan, math.nan], 50)
    assert np.isnan(held[:2]).all()
    np.testing.assert_array_equal(held[2:4], [0.4, 0.4])
    assert np.isnan(held[4])  # 0.4 at step 2 has left the window


def test_the_streamed_hold_equals_the_run_file_hold_and_carries_the_item():
    rng = np.random.default_rng(0)
    steps = np.sort(rng.choice(2000, size=400, replace=False))
    risk = rng.random(400)
    risk[rng.random(400) < 0.1] = np.nan
    live, items = RiskHold(37), []
    for s, p in zip(steps, risk, strict=True):
        held, item = live.update(int(s), float(p), item=int(s))
        items.append((held, item))
    batch = hold_risk(steps, risk, 37)
    np.testing.assert_array_equal([h for h, _ in items], batch)
    for (held, from_step), s in zip(items, steps, strict=True):
        if not math.isnan(held):  # the item is that of the held answer, from the window
            assert s - 37 < from_step <= s and risk[steps == from_step][0] == held


def test_a_flickering_risk_is_one_alarm_held_and_five_raw():
    steps = np.arange(0, 200, 10)
    risk = np.where(np.arange(20) % 2 == 0, 0.9, 0.1)
    risk[10:] = 0.1  # five flickers, then quiet
    assert alarm_starts(risk, 0.5).size == 5
    assert alarm_starts(hold_risk(steps, risk, 50), 0.5).size == 1
    run = ScoredRun("r", "real", steps, hold_risk(steps, risk, 50), None)
    assert event_metrics([run], 0.5).false_alarms == 1


def test_the_first_alarm_comes_at_the_same_step_held_or_not():
    rng = np.random.default_rng(1)
    steps = np.arange(500)
    risk = rng.random(500) * 0.6
    risk[300:] += 0.35
    raw_first = np.argmax(risk >= 0.8)
    assert np.argmax(hold_risk(steps, risk, 50) >= 0.8) == raw_first > 0


def test_negative_hold_is_refused():
    with pytest.raises(ValueError, match="hold steps must be >= 0, got -1"):
        RiskHold(-1)


def test_a_hold_restored_from_its_state_answers_as_the_original():
    rng = np.random.default_rng(2)
    steps, risk = np.arange(0, 300, 7), rng.random(43)
    original = RiskHold(50)
    for s, p in zip(steps[:20], risk[:20], strict=True):
        original.update(int(s), float(p), item=f"level-{s}")
    restored = RiskHold(0).load_state_dict(original.state_dict())
    for s, p in zip(steps[20:], risk[20:], strict=True):
        assert restored.update(int(s), float(p)) == original.update(int(s), float(p))
