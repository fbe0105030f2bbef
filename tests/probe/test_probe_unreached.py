"""A model whose attention the probe cannot reach gets NaN attention signals and one warning
saying which and why (transformers' eager attention computes softmax by hand)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from probe_models import tiny_gpt, token_batches, train
from torch import nn

from collapse_guard.probe import Probe, ProbeConfig
from collapse_guard.probe.attention import AttentionGroup

transformers = pytest.importorskip("transformers")


def _llama(attn: str) -> nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    return transformers.LlamaForCausalLM._from_config(config, attn_implementation=attn)


def _records(model: nn.Module, steps: int = 3) -> tuple[list[dict], list[str]]:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    probe = Probe(model, optimizer, ProbeConfig(attention_every=1))
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    records = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(steps):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            probe.after_backward(loss)
            optimizer.step()
            records.append(probe.after_step())
            optimizer.zero_grad()
    probe.close()
    return records, [str(w.message) for w in caught if "collapse-guard probe" in str(w.message)]


def test_eager_attention_warns_once_naming_the_nan_signals_and_the_fix():
    records, said = _records(_llama("eager"))
    assert all(math.isnan(r[k]) for r in records for k in AttentionGroup.keys)
    assert len(said) == 1  # three probe passes, one warning
    assert all(k in said[0] for k in AttentionGroup.keys)
    assert "attn_implementation='eager'" in said[0] and "'sdpa'" in said[0]


def test_sdpa_attention_is_measured_without_a_word():
    records, said = _records(_llama("sdpa"))
    assert said == []
    assert all(math.isfinite(r["attn_entropy_mean"]) for r in records)


def test_a_model_without_attention_has_nothing_to_miss():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = Probe(model, optimizer, ProbeConfig(attention_every=1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        for _ in range(2):
            loss = model(torch.ones(3, 4)).square().mean()
            loss.backward()
            probe.after_backward(loss)
            optimizer.step()
            assert math.isnan(probe.after_step()["attn_entropy_mean"])
            optimizer.zero_grad()


def test_the_projects_own_gpt_is_reached():
    model = tiny_gpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    probe = Probe(model, optimizer, ProbeConfig(attention_every=1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        records = train(model, optimizer, token_batches(2), probe)
    assert math.isfinite(records[-1]["attn_entropy_min"])
