"""Contract tests over every signal family (discovered from FAMILIES)."""

from __future__ import annotations

import math
import sys
from dataclasses import fields

import pytest
import torch
from probe_models import tiny_gpt, token_batches

from collapse_guard.probe import FAMILIES, Event, Probe, ProbeConfig, SignalFamily
from collapse_guard.signals import SIGNAL_NAMES, SIGNALS


def test_families_cover_every_signal_exactly_once():
    keys = [key for family in FAMILIES for key in family.keys]
    assert sorted(keys) == sorted(SIGNAL_NAMES)


def test_default_periods_match_the_signal_table():
    config = ProbeConfig()
    period = {key: getattr(config, f.period_field) for f in FAMILIES for key in f.keys}
    assert period == {s.name: s.period for s in SIGNALS}


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.__name__)
def test_family_contract(family: type[SignalFamily]):
    assert family.period_field in {f.name for f in fields(ProbeConfig)}
    assert family.events and family.events <= set(Event)
    table = (family.__doc__ or "") + (sys.modules[family.__module__].__doc__ or "")
    missing = [key for key in family.keys if f"``{key}``" not in table]
    assert not missing, f"{family.__name__}'s docstring table lacks {missing}"

    fresh = family()  # constructible with defaults; nothing measured yet
    assert list(fresh.get()) == list(family.keys)

    model = tiny_gpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    config = ProbeConfig(attention_every=1, system_every=1, sharpness_every=1, sharpness_iters=2)
    probe = Probe(model, optimizer, config)
    member = next(f for f in probe.families if isinstance(f, family))
    for x, y in token_batches(2):
        _, loss = model(x, y)
        loss.backward()
        probe.after_backward(loss)
        optimizer.step()
        record = probe.after_step()
        assert tuple(record) == SIGNAL_NAMES
    # every family measures something on a GPT with every period at 1 (GPU keys aside)
    measured = [k for k in family.keys if not math.isnan(record[k])]
    assert measured or family.__name__ == "SystemFamily"
    assert list(member.get()) == list(family.keys)  # stable key order, cleared after the step
    member.reset()
    assert list(member.get()) == list(family.keys)
    probe.close()
    probe.close()  # idempotent
