"""Preflight warnings: the seed's safe ranges, and the warmup seen over the first steps."""

import pytest
import torch
from torch import nn

from collapse_guard.guard.preflight import WarmupCheck, lr_ceiling, lr_top, preflight_warnings


def test_the_lr_ceiling_falls_20_percent_per_10b_parameters():
    assert lr_ceiling(0) == 3e-4
    assert lr_ceiling(10_000_000_000) == pytest.approx(2.4e-4)


def test_warnings_name_lr_clip_and_dropout_outside_the_ranges():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.3))
    got = preflight_warnings(model, [0.05], clip=2.0)  # over the 1e-2 cap of small models
    assert len(got) == 3
    assert "LR 0.05" in got[0] and "clipping at 2" in got[1] and "dropout [0.3]" in got[2]
    safe = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1))
    assert preflight_warnings(safe, [3e-4], clip=1.0) == []


def _sized(n_params: int) -> nn.Module:
    """A module of exactly ``n_params`` parameters (no allocation beyond them)."""
    return nn.ParameterList([nn.Parameter(torch.empty(n_params))])


@pytest.mark.parametrize(
    ("n_params", "lr", "warns"),
    [
        (137_000, 3e-4, False),  # issue 21: the tiny GPT at the seed's own top
        (137_000, 3e-3, False),  # the real runs here (1e-3 to 1e-2)
        (10_700_000, 1e-3, False),  # nanoGPT's Shakespeare model at its own LR
        (124_000_000, 6e-4, False),  # GPT-2 small / GPT-3 125M at theirs
        (1_300_000_000, 2e-4, False),  # GPT-3 1.3B
        (1_300_000_000, 1e-3, True),  # 5x GPT-3's for that size
        (137_000, 0.05, True),  # past AdamW's measured edge (0.04) at that size
        (137_000, 1e-6, True),  # under the floor
    ],
)
def test_common_safe_lrs_do_not_warn(n_params, lr, warns):
    with torch.device("meta"):  # sizes without memory
        model = _sized(n_params)
    got = preflight_warnings(model, [lr], clip=1.0)
    assert bool(got) == warns, got


def test_lr_top_is_an_envelope_of_gpt3s_table():
    # Brown et al. 2020, table 2.1: (parameters, peak LR). GPT-3's own LR never warns, and
    # the top is at most 1.6x it where the seed's own top (3e-4 less 20% per 10B) is lower
    for n, lr in ((125e6, 6e-4), (1.3e9, 2e-4), (6.7e9, 1.2e-4), (175e9, 0.6e-4)):
        assert lr <= lr_top(int(n)) <= max(1.6 * lr, lr_ceiling(int(n)) * (1 + 1e-6))


def test_preflight_false_says_nothing_not_even_about_warmup(tmp_path):
    import warnings

    from collapse_guard.guard import Guard

    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)  # flat LR, over the range: two reasons
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        guard = Guard(model, opt, tmp_path, risk="off", preflight=False)
        for _ in range(12):  # past WARMUP_CHECK_STEPS
            loss = model(torch.ones(2, 3)).pow(2).mean()
            loss.backward()
            guard.step(loss)
            opt.zero_grad()
        guard.close()
    assert [str(w.message) for w in caught if "preflight" in str(w.message)] == []


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
