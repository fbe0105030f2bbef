"""Attention group: capture without the model's help, and exact values on known cases."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from probe_models import MHAModel, UniformAttention, tiny_gpt, token_batches, train
from torch import nn

from collapse_guard.probe import AttentionCapture, Probe, ProbeConfig
from collapse_guard.probe.attention import head_similarity
from collapse_guard.probe.capture import capture_attention


def _probe_once(model: nn.Module, batch, **kwargs) -> dict[str, float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    probe = Probe(model, optimizer, ProbeConfig(attention_every=1), probe_batch=batch, **kwargs)
    optimizer.step()
    return probe.after_step()


def test_uniform_attention_has_entropy_log_t_and_full_saturation():
    torch.manual_seed(0)
    tokens = 6
    record = _probe_once(UniformAttention(), torch.randn(2, tokens, 8))
    assert record["attn_entropy_min"] == pytest.approx(math.log(tokens), rel=1e-6)
    assert record["attn_entropy_mean"] == pytest.approx(math.log(tokens), rel=1e-6)
    # every token's output is the same mean of the values: all heads saturated
    assert record["attn_saturation"] == 1.0
    assert record["attn_logit_max"] == 0.0


def test_head_similarity_definition():
    outputs = torch.zeros(1, 3, 4, 2)
    outputs[0, 0] = torch.tensor([1.0, 0.0])  # identical tokens: 1
    outputs[0, 1, :, 0] = torch.tensor([1.0, -1.0, 1.0, -1.0])  # 2 equal, 4 opposite pairs
    outputs[0, 2] = torch.eye(4, 2)  # rows e1, e2, 0, 0: orthogonal or zero
    similarity = head_similarity(outputs)
    assert similarity.tolist() == pytest.approx([1.0, (4 - 8) / 12, 0.0])


def test_sdpa_capture_equals_a_hand_computation():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4) for _ in range(3))
    mask = torch.rand(5, 5) > 0.3
    mask.fill_diagonal_(True)
    expected_out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.7)
    with capture_attention(nn.Module()) as sink:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.7)
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention
    assert torch.equal(out, expected_out)  # the model sees the real function's output
    logits = (q @ k.transpose(-2, -1)) * 0.7
    probs = torch.softmax(logits.masked_fill(~mask, -math.inf), dim=-1)
    torch.testing.assert_close(sink[0].probs, probs)
    torch.testing.assert_close(sink[0].outputs, probs @ v)
    assert sink[0].logit_max.item() == pytest.approx(logits[..., mask].max().item(), rel=1e-6)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    logits = (q @ k.transpose(-2, -1)) / 2.0
    torch.testing.assert_close(
        sink[1].probs, torch.softmax(logits.masked_fill(~causal, -math.inf), dim=-1)
    )


def test_gpt_attention_is_captured_through_sdpa():
    model = tiny_gpt()
    x, y = token_batches(1)[0]
    record = _probe_once(model, (x, y))
    # near-uniform causal attention at init: mean over rows of log(i + 1)
    causal_uniform = sum(math.log(i + 1) for i in range(8)) / 8
    assert record["attn_entropy_mean"] == pytest.approx(causal_uniform, abs=1e-2)
    assert 0.0 <= record["attn_saturation"] <= 1.0
    assert math.isfinite(record["output_entropy"])


def test_unchanged_weights_give_zero_kl():
    model = tiny_gpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    probe = Probe(model, optimizer, ProbeConfig(attention_every=1))
    records = train(model, optimizer, token_batches(3), probe)
    assert math.isnan(records[0]["attn_kl"])
    assert records[1]["attn_kl"] == 0.0 and records[2]["attn_kl"] == 0.0


def test_changed_weights_give_positive_kl():
    model = tiny_gpt()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-2)
    probe = Probe(model, optimizer, ProbeConfig(attention_every=1))
    records = train(model, optimizer, token_batches(3), probe)
    assert records[2]["attn_kl"] > 0.0


def test_multihead_attention_is_captured_and_the_caller_still_gets_weights():
    torch.manual_seed(0)
    model = MHAModel()
    x = torch.randn(2, 5, 8)
    model.eval()
    with torch.no_grad():
        _, weights = model.attn(x, x, x, average_attn_weights=False)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    probe = Probe(model, optimizer, ProbeConfig(attention_every=1), probe_batch=x)
    with capture_attention(model) as sink, torch.no_grad():
        model.eval()
        torch.backends.mha.set_fastpath_enabled(False)
        model(x)
        torch.backends.mha.set_fastpath_enabled(True)
        model.train()
    torch.testing.assert_close(sink[0].probs, weights)
    assert model.last_weights.shape == (2, 5, 5)  # averaged over heads, as the caller asked
    optimizer.step()
    record = probe.after_step()
    entropy = -torch.special.xlogy(weights, weights).sum(-1).mean(dim=(0, 2))
    assert record["attn_entropy_min"] == pytest.approx(entropy.min().item(), rel=1e-5)
    assert model.training


def test_transformer_encoder_fast_path_is_captured():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    model = nn.Sequential(nn.TransformerEncoder(layer, num_layers=2), nn.Linear(8, 3))
    record = _probe_once(model, torch.randn(2, 5, 8))
    assert math.isfinite(record["attn_entropy_mean"])
    assert 0 < record["attn_entropy_mean"] <= math.log(5) + 1e-6


def test_attention_fn_is_the_escape_hatch():
    probs = torch.full((1, 2, 4, 4), 0.25)

    def attention_fn(model: nn.Module) -> list:
        return [probs, AttentionCapture(probs, logit_max=torch.tensor(3.0))]

    model = nn.Linear(4, 4)
    record = _probe_once(model, None, attention_fn=attention_fn)
    assert record["attn_entropy_min"] == pytest.approx(math.log(4))
    assert math.isnan(record["attn_saturation"])  # no outputs given
    assert math.isnan(record["attn_logit_max"])  # not given for every call
