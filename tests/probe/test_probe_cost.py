"""The probe's per-step cost: one pass over the gradients shared with the guard, the
sketch's flat gather equal to its per-tensor one, the non-finite count on the device."""

from __future__ import annotations

import math
import tempfile
import warnings

import pytest
import torch
from probe_models import Layered, tiny_gpt, token_batches
from torch import nn

from collapse_guard.guard import Guard
from collapse_guard.probe import Probe
from collapse_guard.probe.updates import UpdateGroup


def test_tensor_norms_cover_every_trainable_tensor_with_zero_for_no_gradient():
    model = Layered(3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    probe = Probe(model, optimizer)
    model.layers[0].weight.grad = torch.full_like(model.layers[0].weight, 2.0)
    model.layers[2].weight.grad = torch.full_like(model.layers[2].weight, -1.0)
    probe.after_backward(torch.tensor(1.0))
    params = [p for p in model.parameters() if p.requires_grad]
    expected = [p.grad.norm().item() if p.grad is not None else 0.0 for p in params]
    assert probe.tensor_norms.tolist() == pytest.approx(expected, rel=1e-6)
    assert expected.count(0.0) == len(params) - 2  # the gap is there, and filled with 0


def test_a_guarded_step_makes_one_norm_pass_over_the_gradients(monkeypatch):
    model = tiny_gpt()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # preflight: a toy set-up
        guard = Guard(model, optimizer, tempfile.mkdtemp(), risk="off", record=False)
    grads_seen = []
    real = torch._foreach_norm

    def counting(tensors, *args, **kwargs):
        grad_ids = {id(p.grad) for p in model.parameters() if p.grad is not None}
        grads_seen.append(sum(id(t) in grad_ids for t in tensors))
        return real(tensors, *args, **kwargs)

    monkeypatch.setattr(torch, "_foreach_norm", counting)
    for x, y in token_batches(3):
        _, loss = model(x, y)
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad()
    guard.close()
    # before: two passes over the 26 gradients a step (the probe's and the guard's)
    n_grads = sum(1 for p in model.parameters() if p.requires_grad)
    assert [n for n in grads_seen if n] == [n_grads] * 3


def test_flat_gather_gives_the_per_tensor_sketch_bit_for_bit():
    model = tiny_gpt()
    params = [p for p in model.parameters() if p.requires_grad]
    group = UpdateGroup()
    group._setup(params)
    assert group._flat_index is not None  # small tensors: the flat gather on the CPU too
    host_index = [None if i is None else i.cpu() for i in group._index]
    assert torch.equal(group._flat(params, host_index), group._flat_index)
    flat = group._sketch(params)
    group._flat_index = None  # the per-tensor path of larger tensors, forced here
    per_tensor = group._sketch(params)
    assert len(flat) == len(per_tensor) == len(group._segment)
    assert torch.equal(flat, per_tensor)


def test_the_cpu_gathers_per_tensor_once_tensors_are_large():
    large = nn.Sequential(nn.Linear(128, 128), nn.Linear(128, 128))  # 8.3k a tensor
    params = list(large.parameters())
    group = UpdateGroup()
    group._setup(params)
    assert group._flat_index is None
    assert len(group._sketch(params)) == 2 * 2048 + 2 * 128


@pytest.mark.parametrize("host_reads", [True, False])
def test_nonfinite_count_is_the_same_on_the_host_path_and_the_device_path(host_reads):
    model = Layered(3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    probe = Probe(model, optimizer)
    probe.host_reads = host_reads
    values = [math.inf, math.nan, 1.0]
    for layer, value in zip(model.layers, values, strict=True):
        layer.weight.grad = torch.full_like(layer.weight, value)
    model.layers[2].weight.grad[0, 0] = -math.inf
    probe.after_backward(torch.tensor(1.0))
    optimizer.step()
    record = probe.after_step()
    per_layer = model.layers[0].weight.numel()
    assert record["grad_nonfinite"] == 2 * per_layer + 1


def test_after_step_pending_holds_the_same_values_as_after_step():
    records = []
    for pending in (False, True):
        model = tiny_gpt()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        probe = Probe(model, optimizer)
        for batch in token_batches(2):
            x, y = batch
            _, loss = model(x, y)
            loss.backward()
            probe.after_backward(loss)
            optimizer.step()
            if pending:
                raw = probe.after_step_pending()
                record = {k: float(v) for k, v in raw.items()}
            else:
                record = probe.after_step()
            optimizer.zero_grad()
        records.append(record)
    plain, later = records
    assert set(later) <= set(plain)
    for key, value in later.items():
        assert value == plain[key] or (math.isnan(value) and math.isnan(plain[key])), key


def _update_records(host_reads: bool, frozen_from: int) -> list[dict[str, float]]:
    model = tiny_gpt()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    probe = Probe(model, optimizer)
    probe.host_reads = host_reads
    records = []
    for step, (x, y) in enumerate(token_batches(12)):
        _, loss = model(x, y)
        loss.backward()
        if step >= frozen_from:  # no gradient: AdamW leaves that tensor where it is
            model.blocks[1].mlp[2].weight.grad = None
        probe.after_backward(loss)
        optimizer.step()
        records.append({k: probe.after_step()[k] for k in UpdateGroup.keys})
        optimizer.zero_grad()
    return records


def test_update_signals_take_the_same_bits_on_the_host_shortcut_and_the_device_path():
    # host_reads: on the CPU the probe asks whether every tensor moved (then the reference
    # is the update itself and its norm is reused); without, the device path's select
    shortcut, device = _update_records(True, 6), _update_records(False, 6)
    assert len(shortcut) == 12
    assert all(math.isfinite(r["update_cos"]) for r in shortcut[1:])  # measured each step
    assert shortcut[7]["update_cos"] != shortcut[5]["update_cos"]  # the freeze shows
    for ours, theirs in zip(shortcut, device, strict=True):
        for key, value in ours.items():
            assert value == theirs[key] or (math.isnan(value) and math.isnan(theirs[key])), key


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64]
)
def test_cpu_values_reach_the_record_as_the_stacked_copy_gives_them(dtype):
    from collapse_guard.probe.state import to_floats

    raw = [1 / 3, -2.5e-7, 12345.678, 7.0, 2.0**40 + 1]
    values = {f"v{i}": torch.tensor(v).to(dtype) for i, v in enumerate(raw)}
    stacked = torch.stack([v.reshape(()).double() for v in values.values()]).tolist()
    assert list(to_floats({**values, "plain": 0.5}).values()) == [*stacked, 0.5]


def test_the_probe_sees_a_parameter_frozen_added_or_swapped_during_the_run():
    model = Layered(2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    probe = Probe(model, optimizer)

    def measured() -> tuple[int, float]:
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        probe.after_backward(torch.tensor(1.0))
        n = len(probe.tensor_norms)
        return n, probe.after_step()["param_norm"]

    every = len(list(model.parameters()))
    first = measured()[0]
    assert first == every
    model.layers[0].weight.requires_grad_(False)  # read every step
    assert measured()[0] == every - 1
    model.layers[1].extra = nn.Parameter(torch.full((3,), 4.0))  # registered: walked again
    grown, grown_norm = measured()
    assert grown == every
    model.layers[1].weight = nn.Parameter(torch.zeros_like(model.layers[1].weight))
    swapped, swapped_norm = measured()
    assert swapped == every
    assert swapped_norm < grown_norm  # the zero weight is measured, not the one it replaced
