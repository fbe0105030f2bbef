"""Preflight warnings: the seed's safe ranges, and the warmup seen over the first steps."""

import pytest
from torch import nn

from collapse_guard.guard.preflight import WarmupCheck, lr_ceiling, preflight_warnings


def test_the_lr_ceiling_falls_20_percent_per_10b_parameters():
    assert lr_ceiling(0) == 3e-4
    assert lr_ceiling(10_000_000_000) == pytest.approx(2.4e-4)


def test_warnings_name_lr_clip_and_dropout_outside_the_ranges():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.3))
    got = preflight_warnings(model, [1e-2], clip=2.0)
    assert len(got) == 3
    assert "LR 0.01" in got[0] and "clipping at 2" in got[1] and "dropout [0.3]" in got[2]
    safe = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1))
    assert preflight_warnings(safe, [3e-4], clip=1.0) == []


def test_no_warmup_is_seen_after_ten_steps():
    flat, rising = WarmupCheck(), WarmupCheck()
    flat_msgs = [flat.add(1e-3) for _ in range(12)]
    assert flat_msgs[9] is not None and "no warmup" in flat_msgs[9]
    assert [m for i, m in enumerate(flat_msgs) if i != 9] == [None] * 11  # once
    assert all(rising.add(1e-4 * (i + 1)) is None for i in range(12))


def test_the_probe_records_to_any_sink_object():
    import torch

    from collapse_guard.probe import Probe

    class ListSink:
        def __init__(self):
            self.rows, self.closed = [], False

        def append(self, step, record, event=""):
            self.rows.append((step, record["loss"]))

        def close(self):
            self.closed = True

    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    probe, sink = Probe(model, opt), ListSink()
    assert probe.record_to(sink) is sink
    for _ in range(3):
        loss = model(torch.ones(2, 3)).pow(2).mean()
        loss.backward()
        probe.after_backward(loss)
        opt.step()
        probe.after_step()
        opt.zero_grad()
    probe.close()
    assert [s for s, _ in sink.rows] == [0, 1, 2] and sink.closed
