"""The guard's per-step cost: its risk window scored through the array path (the same
risk as the frame path), and the host reads of a healthy step counted."""

from __future__ import annotations

import numpy as np
import pytest
from guard_helpers import Loop, tiny_model

from collapse_guard.features import RunContext
from collapse_guard.features.ring import SignalRing
from collapse_guard.guard import Guard
from collapse_guard.guard.risk_source import EmbeddedRisk
from collapse_guard.signals import SIGNAL_NAMES


def test_the_ring_window_scores_as_its_frame_does(risk_model):
    rng = np.random.default_rng(0)
    ring = SignalRing(risk_model.schema.window, SIGNAL_NAMES)
    context = RunContext.from_schema(risk_model.schema)
    for step in range(260):  # past the ring's capacity: it has wrapped
        row = rng.lognormal(0.5, 0.3, len(SIGNAL_NAMES))
        row[rng.random(len(row)) < 0.3] = np.nan  # signals not measured at every step
        ring.append(step, row)
        context.update(step, dict(zip(SIGNAL_NAMES, map(float, row), strict=True)))
    window, ctx = ring.window(), context.get()
    reading = EmbeddedRisk(risk_model).score(259, window, ctx)
    assert reading.probability == risk_model.predict_window(window.frame(), context=ctx)
    assert 0.0 < reading.probability < 1.0


def test_the_guard_submits_its_ring_and_reads_a_risk_every_risk_every_steps(tmp_path, risk_model):
    model, optimizer = tiny_model()
    config = {"risk_every": 10}
    guard = Guard(model, optimizer, tmp_path, risk=risk_model, config=config, preflight=False)
    loop = Loop()
    for _ in range(25):
        guard.step(loop.loss(model))
        optimizer.zero_grad()
    guard.close()
    assert [s for s, _ in guard.risk_readings] == [9, 19]
    assert len(guard.window) == 25 and guard.window.window().steps.tolist() == list(range(25))
    assert all(0.0 < p < 1.0 for _, p in guard.risk_readings)
    with pytest.raises(ValueError, match="at least one step"):
        SignalRing(0, SIGNAL_NAMES)
