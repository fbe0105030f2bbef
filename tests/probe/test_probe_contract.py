"""Contract tests over every signal family (discovered from FAMILIES)."""

from __future__ import annotations

import math
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
    assert family.events <= set(Event)
    for key in family.keys:  # the docstring table lists every key
        assert f"``{key}``" in (family.__doc__ or "") + (
            __import__(family.__module__, fromlist=["x"]).__doc__ or ""
        )
    instance = family()  # constructible with defaults
    assert set(instance.get()) == set(family.keys) and all(
        math.isnan(v) for k, v in instance.get().items() if k != "overflow"
    )

    model = tiny_gpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = Probe(model, optimizer, ProbeConfig(attention_every=1, system_every=1))
    probe_family = next(f for f in probe.families if isinstance(f, family))
    for x, y in token_batches(2):
        _, loss = model(x, y)
        loss.backward()
        probe.after_backward(loss)
        optimizer.step()
        probe.after_step()
    assert list(probe_family.get()) == list(family.keys)  # stable key order
    probe_family.reset()
    assert list(probe_family.get()) == list(family.keys)
    assert probe_family.update is not None and probe_family.reset() is None
    probe.close()
    probe.close()  # idempotent
