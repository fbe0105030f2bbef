"""The mistakes a user makes in the loop are caught: two guard.step calls for one
backward, no backward at all, a NaN in a parameter the forward never reads, a loss that
is not a scalar, an optimizer of another model, a model with no parameters."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from guard_helpers import Loop, tiny_model
from torch import nn

from collapse_guard.guard import Guard
from collapse_guard.runfiles import read_run


def _guard(tmp_path, **config):
    model, opt = tiny_model()
    guard = Guard(model, opt, tmp_path, risk="off", policy={"checkpoint_every": 10, **config})
    return guard, model, opt


def _stale_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "The update is skipped" in str(w.message)]


def test_two_steps_for_one_backward_apply_one_update(tmp_path):
    guard, model, opt = _guard(tmp_path)
    loop = Loop()
    updates = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(40):
            loss = loop.loss(model)
            for _ in range(2):  # the mistake: guard.step twice per batch
                updates += guard.step(loss).apply_update
            opt.zero_grad()
    guard.close()
    assert updates == 40  # one per backward, not 80
    said = _stale_warnings(caught)
    assert len(said) == 1 and "guard.step was called twice for one backward" in said[0]
    events = read_run(guard.run_path)[0]["event"].tolist()
    assert sum("skip:same_gradients" in e for e in events) == 40


def test_no_backward_trains_nothing_and_writes_no_healthy_checkpoint(tmp_path):
    guard, model, _ = _guard(tmp_path)
    before = [p.detach().clone() for p in model.parameters()]
    loop = Loop()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(30):
            x, y = loop.next()
            _, loss = model(x, y)  # the mistake: no loss.backward()
            assert not guard.step(loss).apply_update
    guard.close()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert guard.checkpoints == 0 and not list(tmp_path.glob("guard-0*.pt"))  # the origin only
    said = _stale_warnings(caught)
    assert len(said) == 1 and "loss.backward() was not called" in said[0]


def test_zero_grad_without_backward_is_caught_too(tmp_path):
    guard, model, opt = _guard(tmp_path)
    loop = Loop()
    guard.step(loop.loss(model))
    opt.zero_grad(set_to_none=False)  # gradients kept, zeroed: new tensors never come
    with pytest.warns(RuntimeWarning, match="every gradient is exactly zero"):
        decision = guard.step(torch.tensor(2.0))
    assert decision.reason == "zero_gradients" and not decision.apply_update
    guard.close()


def test_accumulation_over_micro_batches_is_one_fresh_step(tmp_path):
    guard, model, opt = _guard(tmp_path)
    loop = Loop()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for _ in range(15):
            for _ in range(2):  # two backward() calls accumulate into the same .grad
                loss = loop.loss(model)
            assert guard.step(loss).apply_update
            opt.zero_grad(set_to_none=False)  # in place: same tensors, new versions
    guard.close()


class WithUnused(nn.Module):
    """The tiny GPT beside a parameter its forward never reads (an unused embedding row)."""

    def __init__(self) -> None:
        super().__init__()
        self.gpt, _ = tiny_model()
        self.unused_row = nn.Parameter(torch.zeros(4))

    def forward(self, x, y):
        return self.gpt(x, y)


def test_a_nan_in_an_unused_parameter_never_goes_into_a_healthy_checkpoint(tmp_path):
    model = WithUnused()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    guard = Guard(model, opt, tmp_path, risk="off", policy={"checkpoint_every": 10})
    unused = model.unused_row
    loop = Loop()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(60):
            if step == 25:
                with torch.no_grad():
                    unused[1] = math.nan
            guard.step(loop.loss(model))
            opt.zero_grad()
    guard.close()
    steps = [torch.load(p, weights_only=True)["step"] for p in tmp_path.glob("guard-*.pt")]
    assert steps and max(steps) <= 25  # none after the NaN
    for path in tmp_path.glob("guard-*.pt"):
        model_state = torch.load(path, weights_only=True)["model"]
        assert all(torch.isfinite(v).all() for v in model_state.values() if v.is_floating_point())
    said = [str(w.message) for w in caught if "holds NaN or inf" in str(w.message)]
    assert len(said) == 1 and "'unused_row'" in said[0]
    events = read_run(guard.run_path)[0]["event"].tolist()
    assert any("checkpoint_refused:nonfinite_param=unused_row" in e for e in events)


@pytest.mark.parametrize(
    ("loss", "error", "match"),
    [
        (torch.ones(8, requires_grad=True), ValueError, r"shape \(8,\).*loss\.mean\(\)"),
        (torch.ones(2, 3), ValueError, r"scalar tensor.*shape \(2, 3\)"),
        ("2.5", TypeError, r"scalar tensor.*got str"),
        (None, TypeError, r"got NoneType"),
    ],
)
def test_a_loss_that_is_not_a_scalar_is_a_clear_error(tmp_path, loss, error, match):
    guard, model, _ = _guard(tmp_path)
    Loop().loss(model)
    with pytest.raises(error, match=match):
        guard.step(loss)
    assert guard.step_index == 0  # nothing was measured nor applied
    guard.close()


def test_an_optimizer_of_another_model_is_refused(tmp_path):
    model_a, opt_a = tiny_model(seed=0)
    model_b, _ = tiny_model(seed=1)
    with pytest.raises(ValueError, match=r"none of the optimizer's \d+ parameters belong"):
        Guard(model_b, opt_a, tmp_path, risk="off")
    assert model_a is not model_b


def test_a_model_without_parameters_is_an_error(tmp_path):
    stray = nn.Parameter(torch.zeros(2))
    with pytest.raises(ValueError, match=r"ReLU\) has no parameters"):
        Guard(nn.ReLU(), torch.optim.SGD([stray], lr=0.1), tmp_path, risk="off")
