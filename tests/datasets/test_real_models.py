"""Real runs: every model family trains, and the probe reads its attention without help.

Each family is a tiny seeded model (1 layer, width 32, 16 tokens) trained a few steps
with AdamW through the public ``Probe`` loop; the probe's attention family runs at
step 0 (its first probe pass), so its signals must be measured and finite there.
"""

from __future__ import annotations

import math

import pytest
import torch

from collapse_guard.datasets.real import FAMILIES
from collapse_guard.datasets.real.models import FAMILY_CLASSES, ModelConfig, build_model
from collapse_guard.probe import Probe, ProbeConfig

TINY = ModelConfig(vocab_size=64, seq_len=16, n_layer=1, n_head=4, d_model=32)


def test_every_config_family_has_a_model_module():
    assert set(FAMILY_CLASSES) == set(FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_family_trains_and_the_probe_reads_its_attention(family):
    torch.manual_seed(0)
    model = build_model(family, TINY)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    probe = Probe(model, optimizer, ProbeConfig(attention_every=1))
    generator = torch.Generator().manual_seed(1)
    # a learnable stream: each token is the previous one plus 1 (mod vocab)
    start = torch.randint(0, 64, (8, 1), generator=generator)
    tokens = (start + torch.arange(17)) % 64
    losses, records = [], []
    for _ in range(12):
        _, loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        probe.after_backward(loss)
        optimizer.step()
        records.append(probe.after_step())
        optimizer.zero_grad()
        losses.append(loss.item())
    probe.close()
    assert losses[0] == pytest.approx(math.log(64), abs=0.5)  # ~uniform at init
    assert losses[-1] < losses[0] - 0.5  # it learns
    for record in (records[0], records[-1]):
        for name in ("attn_entropy_min", "attn_entropy_mean", "attn_logit_max", "attn_saturation"):
            assert math.isfinite(record[name]), (family, name, record[name])
        # four heads over at most 16 keys: entropy between 0 and ln 16
        assert 0.0 <= record["attn_entropy_min"] <= record["attn_entropy_mean"] <= math.log(16)
    assert math.isfinite(records[-1]["attn_kl"])  # the second probe pass compares to the first
    assert records[-1]["output_logit_max"] > 0


def test_rope_swiglu_ties_its_head_and_mha_uses_torch_attention():
    rope = build_model("rope_swiglu", TINY)
    assert rope.head.weight is rope.tok_emb.weight
    assert not hasattr(rope, "pos_emb")
    mha = build_model("mha", TINY)
    assert isinstance(mha.blocks[0].attn.mha, torch.nn.MultiheadAttention)


def test_families_refuse_knobs_they_do_not_have():
    with pytest.raises(ValueError, match="no qk-norm"):
        build_model("mha", ModelConfig(qk_norm=True))
    with pytest.raises(ValueError, match="pre-norm only"):
        build_model("rope_swiglu", ModelConfig(pre_ln=False))
    with pytest.raises(ValueError, match="expected one of gpt, rope_swiglu, mha"):
        build_model("rwkv", ModelConfig())


def test_rotary_rotation_keeps_norms_and_moves_only_later_positions():
    from collapse_guard.datasets.real.models.layers import Rotary

    rotary = Rotary(head_dim=8, seq_len=5)
    x = torch.randn(2, 3, 5, 8)
    y = rotary(x)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(y[:, :, 0], x[:, :, 0])  # position 0: angle 0
    assert not torch.allclose(y[:, :, 1], x[:, :, 1])
