"""Output, AMP and system groups."""

from __future__ import annotations

import math

import pytest
import torch
from probe_models import probed_step, scaled_records, tiny_gpt, token_batches, train
from torch import nn

from collapse_guard.probe import Probe, ProbeConfig
from collapse_guard.probe.capture import ProbePass
from collapse_guard.probe.outputs import PredictionGroup
from collapse_guard.probe.state import Event, ProbeState
from collapse_guard.probe.system import host_mem_available


def test_output_logit_max_is_the_largest_training_logit():
    model = tiny_gpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    record, logits, loss = probed_step(
        model, optimizer, token_batches(1)[0], Probe(model, optimizer)
    )
    assert record["output_logit_max"] == pytest.approx(logits.abs().max().item())
    assert record["loss"] == pytest.approx(loss.item())


def test_prediction_entropy_and_repetition_on_known_logits():
    logits = torch.full((1, 4, 3), -math.inf)
    logits[0, :3, 0] = 0.0  # three positions say token 0 for sure: entropy 0
    logits[0, 3] = 0.0  # one uniform position: entropy log 3, argmax 0 (first)
    logits[0, 3, 2] = 1e-3  # ... nudged so its argmax is token 2
    state = ProbeState(0, Event.AFTER_STEP, nn.Linear(1, 1), None, probe_pass=ProbePass([], logits))
    values = PredictionGroup().update(state).get()
    assert values["output_repetition"] == 0.75
    assert values["output_entropy"] == pytest.approx(math.log(3) / 4, rel=1e-3)


def test_grad_scaler_fields_and_unscaled_gradient_norm():
    plain = scaled_records(None)
    assert math.isnan(plain[0]["loss_scale"]) and plain[0]["overflow"] == 0.0
    scaled = scaled_records(torch.amp.GradScaler("cpu", init_scale=1024.0), inf_at=1)
    assert scaled[0]["loss_scale"] == 1024.0 and scaled[0]["overflow"] == 0.0
    assert scaled[0]["grad_norm"] == pytest.approx(plain[0]["grad_norm"], rel=1e-5)
    assert scaled[1]["overflow"] == 1.0 and scaled[1]["grad_nonfinite"] == 1.0
    assert scaled[2]["loss_scale"] == 512.0 and scaled[2]["overflow"] == 0.0
    assert math.isnan(scaled[1]["update_cos"])  # the skipped step did not move the weights


def test_overflow_is_seen_before_scaler_update_too():
    model = tiny_gpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    probe = Probe(model, optimizer, scaler=scaler)
    x, y = token_batches(1)[0]
    _, loss = model(x, y)
    scaler.scale(loss).backward()
    model.head.weight.grad[0, 0] = math.nan
    probe.after_backward(loss)
    scaler.step(optimizer)
    record = probe.after_step()  # before update()
    scaler.update()
    assert record["overflow"] == 1.0 and record["loss_scale"] == 8.0


def test_system_signals():
    model = tiny_gpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    record = train(model, optimizer, token_batches(1), Probe(model, optimizer))[0]
    expected = host_mem_available()
    if math.isnan(expected):
        pytest.skip("no /proc/meminfo here")
    assert record["host_mem_available"] == pytest.approx(expected, rel=0.2)
    assert math.isnan(record["gpu_power_w"]) and math.isnan(record["gpu_mem_used"])  # CPU model
    off = train(
        model, optimizer, token_batches(1), Probe(model, optimizer, ProbeConfig(system_every=0))
    )
    assert math.isnan(off[0]["host_mem_available"])
