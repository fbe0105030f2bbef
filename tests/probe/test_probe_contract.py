"""Contract tests over every signal group (discovered from GROUPS)."""

from __future__ import annotations

import math
import sys
from dataclasses import fields

import pytest
import torch
from probe_models import tiny_gpt, token_batches

from collapse_guard.probe import GROUPS, Event, Probe, ProbeConfig, SignalGroup
from collapse_guard.signals import SIGNAL_NAMES, SIGNALS


def test_groups_cover_every_signal_exactly_once():
    keys = [key for group in GROUPS for key in group.keys]
    assert sorted(keys) == sorted(SIGNAL_NAMES)


def test_default_periods_match_the_signal_table():
    config = ProbeConfig()
    period = {key: getattr(config, f.period_field) for f in GROUPS for key in f.keys}
    assert period == {s.name: s.period for s in SIGNALS}


@pytest.mark.parametrize("group", GROUPS, ids=lambda f: f.__name__)
def test_group_contract(group: type[SignalGroup]):
    assert group.period_field in {f.name for f in fields(ProbeConfig)}
    assert group.events and group.events <= set(Event)
    table = (group.__doc__ or "") + (sys.modules[group.__module__].__doc__ or "")
    missing = [key for key in group.keys if f"``{key}``" not in table]
    assert not missing, f"{group.__name__}'s docstring table lacks {missing}"

    fresh = group()  # constructible with defaults; nothing measured yet
    assert list(fresh.get()) == list(group.keys)

    model = tiny_gpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    config = ProbeConfig(
        attention_every=1,
        system_every=1,
        sharpness_every=1,
        sharpness_iters=2,
        optimizer_every=1,
        line_every=1,
    )
    probe = Probe(model, optimizer, config)
    member = next(f for f in probe.groups if isinstance(f, group))
    for x, y in token_batches(2):
        _, loss = model(x, y)
        loss.backward()
        probe.after_backward(loss)
        optimizer.step()
        record = probe.after_step()
        assert tuple(record) == SIGNAL_NAMES
    # every group measures something on a GPT with every period at 1 (GPU keys aside)
    measured = [k for k in group.keys if not math.isnan(record[k])]
    assert measured or group.__name__ == "SystemGroup"
    assert list(member.get()) == list(group.keys)  # stable key order, cleared after the step
    member.reset()
    assert list(member.get()) == list(group.keys)
    probe.close()
    probe.close()  # idempotent


def test_the_old_family_names_still_import_with_a_warning():
    import collapse_guard.probe as probe

    with pytest.warns(DeprecationWarning, match="FAMILIES is now GROUPS"):
        assert probe.FAMILIES is probe.GROUPS
    with pytest.warns(DeprecationWarning, match="SignalFamily is now SignalGroup"):
        assert probe.SignalFamily is probe.SignalGroup
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        probe.Nope  # noqa: B018
