"""The guard's live window: a ring array scored through transform_array gives the
offline features (transform_run over the whole recorded run) to the bit."""

import numpy as np
import pytest

from collapse_guard.features import FeatureExtractor, RunContext
from collapse_guard.features.ring import SignalRing
from collapse_guard.signals import SIGNAL_NAMES

from .traces import probe_like_run


def test_the_ring_gives_the_offline_features_to_the_bit():
    frame = probe_like_run(steps=450, seed=2)  # NaN stretches, 30 missing rows, NaN losses
    fx = FeatureExtractor()
    ring, context = SignalRing(fx.window, SIGNAL_NAMES), RunContext.from_schema(fx.schema)
    ends, live = [], []
    for i, row in enumerate(frame.reindex(columns=["step", *SIGNAL_NAMES]).to_numpy()):
        step, values = int(row[0]), row[1:]
        ring.append(step, values)
        context.update(step, {k: float(v) for k, v in zip(SIGNAL_NAMES, values, strict=True)})
        if i % 37 == 0 or i == len(frame) - 1:  # ends before the ring is full, and after
            window = ring.window()
            ends.append(step)
            live.append(fx.transform_array(window.columns(fx.signals), window.steps, context.get()))
    offline = fx.transform_run(frame, steps=ends).to_numpy()
    assert len(ends) == 13 and ring.count == len(frame) > ring.capacity
    assert np.array_equal(np.stack(live), offline, equal_nan=True)


def test_the_ring_keeps_the_last_rows_oldest_first_and_round_trips():
    ring = SignalRing(3, ("loss", "lr"))
    for step in range(5):
        ring.append(step, [float(step), 10.0 * step])
    window = ring.window()
    assert window.steps.tolist() == [2, 3, 4] and window["loss"].tolist() == [2.0, 3.0, 4.0]
    assert dict(window)["lr"].tolist() == [20.0, 30.0, 40.0]  # a mapping the client sends
    assert window.columns(("lr", "grad_norm"))[:, 0].tolist() == [20.0, 30.0, 40.0]
    assert np.isnan(window.columns(("lr", "grad_norm"))[:, 1]).all()
    ring.append(5, [5.0, 50.0])
    assert window.steps.tolist() == [2, 3, 4]  # a window is a copy
    copy = SignalRing(3, ("loss", "lr"))
    copy.load(*ring.state())
    assert copy.window().steps.tolist() == [3, 4, 5] and copy.state() == ring.state()
    assert window.frame().columns.tolist() == ["step", "loss", "lr"]
    with pytest.raises(ValueError, match="2 steps for 1 rows"):
        copy.load([1, 2], [[1.0, 2.0]])
