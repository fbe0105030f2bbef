"""What both integrations share, on a plain torch optimizer: the guard owns ``step``, and
the framework's clipping bound becomes the guard's."""

from __future__ import annotations

import warnings

import pytest
import torch

from collapse_guard.guard import Guard, GuardPolicy
from collapse_guard.integrations._owned_step import OwnedStep, callback_policy, policy_with_clip


def test_the_guard_owns_step_under_a_scheduler_and_gives_it_back(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    wrapped = optimizer.step  # the scheduler's wrapper, set on the object
    guard = Guard(model, optimizer, tmp_path, risk="off", preflight=False)
    losses = []
    owned = OwnedStep(optimizer, guard, lambda: losses.pop() if losses else None)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    moved = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "scheduler before optimizer.step()" warnings
        for action in (None, "skip", None):
            if action:
                guard.force_next(action)
            before = model.weight.detach().clone()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            losses.append(loss.detach())
            optimizer.step()  # what the framework calls
            optimizer.zero_grad()
            scheduler.step()
            moved.append(not torch.equal(before, model.weight))
    assert moved == [True, False, True]
    assert [e for _, e in guard.events] == ["skip:forced"]
    with pytest.raises(RuntimeError, match="no training loss was seen"):
        optimizer.step()
    owned.remove()
    assert optimizer.step is wrapped
    guard.close()


@pytest.mark.parametrize(
    ("config", "bound", "clip", "warns"),
    [
        (None, 0.5, 0.5, False),  # the framework's bound becomes the guard's
        (None, 0.0, 1.0, False),  # framework clipping off: the policy's default
        ({"max_rescues": 2}, 0.5, 0.5, False),  # a config without clip: still the bound
        ({"clip": 0.25}, 0.5, 0.25, True),  # the config's own clip wins, with a warning
        (GuardPolicy(clip=0.5), 0.5, 0.5, False),
    ],
)
def test_the_framework_clipping_bound_becomes_the_guard_clip(config, bound, clip, warns):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        policy = policy_with_clip(config, bound, "max_grad_norm")
    assert policy.clip == clip
    assert bool(caught) == warns


def test_a_callback_takes_policy_and_its_old_name_config_with_a_warning():
    given = {"policy": {"clip": 0.5}, "risk": "off"}
    assert callback_policy(given) == {"clip": 0.5} and given == {"risk": "off"}
    old = {"config": {"clip": 0.5}}
    with pytest.warns(DeprecationWarning, match=r"GuardCallback\(config=...\) is deprecated"):
        assert callback_policy(old) == {"clip": 0.5} and old == {}
    with pytest.raises(TypeError, match="pass policy= alone"):
        callback_policy({"policy": {}, "config": {}})
