"""The probe's public API: key set, periods, errors, non-interference, run files."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from probe_models import NoAttention, probed_step, tiny_gpt, token_batches, train

from collapse_guard.probe import Probe, ProbeConfig
from collapse_guard.signals import SIGNAL_NAMES


def test_record_has_every_signal_every_step_and_nan_off_period():
    model = tiny_gpt()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    probe = Probe(model, optimizer, ProbeConfig(attention_every=3, system_every=2))
    records = train(model, optimizer, token_batches(4), probe)
    for record in records:
        assert tuple(record) == SIGNAL_NAMES
        assert all(isinstance(v, float) for v in record.values())
    assert probe.step == 4
    measured = [not math.isnan(r["attn_entropy_mean"]) for r in records]
    assert measured == [True, False, False, True]
    assert [not math.isnan(r["host_mem_available"]) for r in records] == [True, False] * 2
    assert all(math.isnan(r["sharpness"]) for r in records)  # off by default
    assert all(math.isfinite(r[k]) for r in records for k in ("loss", "grad_norm", "lr"))


def test_training_is_bit_identical_with_and_without_the_probe():
    config = ProbeConfig(attention_every=2, system_every=1, sharpness_every=3, sharpness_iters=2)

    def run(with_probe: bool) -> tuple[torch.nn.Module, torch.Tensor]:
        model = tiny_gpt(dropout=0.1, seed=3)  # dropout: training consumes the global RNG
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        probe = Probe(model, optimizer, config) if with_probe else None
        records = train(model, optimizer, token_batches(6), probe)
        if with_probe:  # the window did include probe passes and sharpness
            assert not math.isnan(records[4]["attn_kl"])
            assert not math.isnan(records[3]["sharpness"])
        assert model.training and all(m.training for m in model.modules())
        return model, torch.get_rng_state()

    plain, plain_rng = run(False)
    probed, probed_rng = run(True)
    for (name, a), (_, b) in zip(
        plain.state_dict().items(), probed.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    assert torch.equal(plain_rng, probed_rng)


def test_lr_set_by_the_loop_or_by_a_scheduler():
    model = tiny_gpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    probe = Probe(model, optimizer)
    lrs = []
    for step, batch in enumerate(token_batches(3)):
        for group in optimizer.param_groups:  # nanoGPT style
            group["lr"] = 0.1 * (step + 1)
        lrs.append(probed_step(model, optimizer, batch, probe)[0]["lr"])
        optimizer.zero_grad()
    assert lrs == pytest.approx([0.1, 0.2, 0.3])

    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    for group in optimizer.param_groups:
        group["lr"] = 1.0
    scheduler.base_lrs = [1.0]
    lrs = []
    for batch in token_batches(2):
        lrs.append(probed_step(model, optimizer, batch, probe)[0]["lr"])
        scheduler.step()  # after after_step: the record holds the step's own lr
        optimizer.zero_grad()
    assert lrs == pytest.approx([1.0, 0.5])


def test_nonfinite_loss_is_kept_and_flagged():
    model = tiny_gpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    probe = Probe(model, optimizer)
    x, y = token_batches(1)[0]
    _, loss = model(x, y)
    (loss * math.nan).backward()
    probe.after_backward(loss * math.nan)
    optimizer.step()
    record = probe.after_step()
    assert math.isnan(record["loss"]) and record["loss_nonfinite"] == 1.0
    assert math.isnan(record["grad_norm"])
    n_params = sum(p.numel() for p in model.parameters())
    assert 0 < record["grad_nonfinite"] <= n_params  # unused embedding rows get exact zeros


def test_finite_loss_is_not_flagged_and_missing_calls_give_nan():
    model = tiny_gpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    probe = Probe(model, optimizer)
    assert train(model, optimizer, token_batches(1), probe)[0]["loss_nonfinite"] == 0.0
    optimizer.step()
    record = probe.after_step()  # no forward, no after_backward this step
    assert tuple(record) == SIGNAL_NAMES
    assert math.isnan(record["loss"]) and math.isnan(record["grad_norm"])
    assert math.isnan(record["output_logit_max"])


def test_model_without_attention_gets_nan_attention_and_no_error():
    model = NoAttention()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = Probe(model, optimizer, ProbeConfig(attention_every=1))
    for _ in range(2):
        loss = model(torch.randn(3, 4)).square().mean()
        loss.backward()
        probe.after_backward(loss)
        optimizer.step()
        record = probe.after_step()
        optimizer.zero_grad()
    for key in ("attn_kl", "attn_entropy_min", "attn_entropy_mean", "attn_saturation"):
        assert math.isnan(record[key])
    assert math.isnan(record["attn_logit_max"]) and math.isnan(record["bottom_grad_norm"])
    assert math.isfinite(record["output_entropy"]) and math.isfinite(record["grad_cv"])


def test_config_errors_say_what_to_do():
    with pytest.raises(ValueError, match=r"unknown ProbeConfig key.*attn_every.*known keys"):
        ProbeConfig.from_dict({"attn_every": 5})
    with pytest.raises(ValueError, match="non-negative int"):
        ProbeConfig(attention_every=-1)
    model = tiny_gpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="unknown ProbeConfig key"):
        Probe(model, optimizer, {"nope": 1})
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        Probe("model", optimizer)
    with pytest.raises(ValueError, match="not a submodule"):
        Probe(model, optimizer, bottom_block="blocks.9")
    assert Probe(model, optimizer, bottom_block="blocks.1").bottom_block is model.blocks[1]


def test_record_to_writes_a_run_file(tmp_path: Path):
    runfile = pytest.importorskip("collapse_guard.runfiles")
    model = tiny_gpt()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    probe = Probe(model, optimizer)
    writer = probe.record_to(tmp_path / "run.parquet", chunk_steps=2)
    records = train(model, optimizer, token_batches(3), probe)
    probe.close()
    probe.close()  # idempotent
    assert writer.closed
    frame, meta = runfile.read_run(tmp_path / "run.parquet")
    assert meta.source == "real" and meta.run_id
    assert frame["step"].tolist() == [0, 1, 2]
    assert frame["loss"].tolist() == pytest.approx([r["loss"] for r in records])
