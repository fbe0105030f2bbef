"""Real runs: every model family trains, and the probe reads its attention without help.

Each family is a tiny seeded model (1 layer, width 32, 16 tokens) trained a few steps
with AdamW through the public ``Probe`` loop; the probe's attention family runs at
step 0 (its first probe pass), so its signals must be measured and finite there.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from collapse_guard.datasets.real import FAMILIES
from collapse_guard.datasets.real.models import FAMILY_CLASSES, ModelConfig, build_model
from collapse_guard.probe import Probe, ProbeConfig

TINY = ModelConfig(vocab_size=64, seq_len=16, n_layer=1, n_head=4, d_model=32)


def test_every_config_family_has_a_model_module():
    assert set(FAMILY_CLASSES) == set(FAMILIES)


def _train_with_probe(model: torch.nn.Module, steps: int = 12) -> tuple[list[float], list[dict]]:
    """AdamW on a learnable stream (each token the previous one plus 1, mod 64)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    probe = Probe(model, optimizer, ProbeConfig(attention_every=1))
    generator = torch.Generator().manual_seed(1)
    start = torch.randint(0, 64, (8, 1), generator=generator)
    tokens = (start + torch.arange(17)) % 64
    losses, records = [], []
    for _ in range(steps):
        _, loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        probe.after_backward(loss)
        optimizer.step()
        records.append(probe.after_step())
        optimizer.zero_grad()
        losses.append(loss.item())
    probe.close()
    return losses, records


def _assert_learns_and_attention_is_read(losses: list[float], records: list[dict], name) -> None:
    assert losses[0] == pytest.approx(math.log(64), abs=0.5)  # ~uniform at init
    assert losses[-1] < losses[0] - 0.5  # it learns
    for record in (records[0], records[-1]):
        for key in ("attn_entropy_min", "attn_entropy_mean", "attn_logit_max", "attn_saturation"):
            assert math.isfinite(record[key]), (name, key, record[key])
        # heads over at most 16 keys: entropy between 0 and ln 16
        assert 0.0 <= record["attn_entropy_min"] <= record["attn_entropy_mean"] <= math.log(16)
    assert math.isfinite(records[-1]["attn_kl"])  # the second probe pass compares to the first
    assert records[-1]["output_logit_max"] > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_family_trains_and_the_probe_reads_its_attention(family):
    torch.manual_seed(0)
    losses, records = _train_with_probe(build_model(family, TINY))
    _assert_learns_and_attention_is_read(losses, records, family)


# every value of every drawn part appears in some case; one case per position scheme
DRAWN_CASES = [
    {"positions": "learned", "block": "serial", "norm": "layernorm", "mlp": "gelu"},
    {"positions": "rope", "block": "parallel", "norm": "rmsnorm", "mlp": "swiglu", "tied": True},
    {"positions": "alibi", "block": "serial", "norm": "rmsnorm", "pre_ln": False, "n_head": 8},
    {"positions": "none", "block": "parallel", "pre_ln": False, "mlp": "swiglu", "n_head": 2},
]


@pytest.mark.parametrize("parts", DRAWN_CASES, ids=lambda parts: parts["positions"])
def test_drawn_parts_train_and_the_probe_reads_their_attention(parts):
    torch.manual_seed(0)
    model = build_model("drawn", dataclasses.replace(TINY, **parts))
    losses, records = _train_with_probe(model)
    _assert_learns_and_attention_is_read(losses, records, parts)
    # every parameter takes part: none sits unused (a post-LN parallel block has one norm)
    assert all(p.grad is None for p in model.parameters())  # zero_grad(set_to_none)
    _, loss = model(torch.zeros(2, 16, dtype=torch.long), torch.zeros(2, 16, dtype=torch.long))
    loss.backward()
    assert all(p.grad is not None for p in model.parameters()), parts
    assert hasattr(model, "pos_emb") == (parts["positions"] == "learned")
    assert (model.head.weight is model.tok_emb.weight) == parts.get("tied", False)


def test_parallel_block_adds_attention_and_mlp_of_the_same_input():
    from collapse_guard.datasets.real.models.layers import ResidualBlock

    torch.manual_seed(0)
    attn, mlp = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
    x = torch.randn(2, 3, 8)
    pre = ResidualBlock(8, lambda: attn, lambda: mlp, parallel=True)
    torch.testing.assert_close(pre(x), x + attn(pre.ln1(x)) + mlp(pre.ln2(x)))
    post = ResidualBlock(8, lambda: attn, lambda: mlp, parallel=True, pre_ln=False)
    torch.testing.assert_close(post(x), post.ln1(x + attn(x) + mlp(x)))
    serial = ResidualBlock(8, lambda: attn, lambda: mlp)
    h = x + attn(serial.ln1(x))
    torch.testing.assert_close(serial(x), h + mlp(serial.ln2(h)))


def test_alibi_bias_falls_linearly_with_distance_and_masks_later_keys():
    from collapse_guard.datasets.real.models.layers import ALiBi

    bias = ALiBi(n_head=4, seq_len=6)(5)
    assert bias.shape == (4, 5, 5)
    slopes = [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8]  # 2^(-8h/n), h = 1..4
    for head, slope in enumerate(slopes):
        assert bias[head, 4, 1].item() == pytest.approx(-3 * slope)  # query 4, key 1
        assert bias[head, 2, 2].item() == 0.0
    assert torch.isinf(bias[:, 1, 2]).all() and (bias[:, 1, 2] < 0).all()
    # with q = k = 0 the logits are the bias alone: each head averages the values it may
    # see with weights softmax(bias), through SDPA
    from collapse_guard.datasets.real.models.layers import SelfAttention

    attention = SelfAttention(8, 2, qk_norm=False, alibi=ALiBi(2, 5))
    with torch.no_grad():
        attention.qkv.weight.zero_()
        attention.qkv.bias.zero_()
        attention.qkv.weight[16:].copy_(torch.eye(8))  # v = x
        attention.proj.weight.copy_(torch.eye(8))
        attention.proj.bias.zero_()
    x = torch.randn(1, 5, 8)
    weights = torch.softmax(ALiBi(2, 5)(5), dim=-1)  # (head, query, key)
    values = x.view(1, 5, 2, 4).transpose(1, 2)  # (batch, head, key, head_dim)
    expected = (weights @ values).transpose(1, 2).reshape(1, 5, 8)
    torch.testing.assert_close(attention(x), expected)


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
    with pytest.raises(ValueError, match="expected one of gpt, rope_swiglu, mha, drawn"):
        build_model("rwkv", ModelConfig())
    with pytest.raises(ValueError, match="no positions='sinusoid'; expected one of learned"):
        build_model("drawn", ModelConfig(positions="sinusoid"))


def test_rotary_rotation_keeps_norms_and_moves_only_later_positions():
    from collapse_guard.datasets.real.models.layers import Rotary

    rotary = Rotary(head_dim=8, seq_len=5)
    x = torch.randn(2, 3, 5, 8)
    y = rotary(x)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(y[:, :, 0], x[:, :, 0])  # position 0: angle 0
    assert not torch.allclose(y[:, :, 1], x[:, :, 1])


def test_a_drawn_nanogpt_run_records_its_parts_in_the_run_file(tmp_path):
    from collapse_guard.datasets.real import Focus, sample_config
    from collapse_guard.datasets.real.runner import run_real
    from collapse_guard.runfiles import read_run

    drawn = sample_config(0, 4, focus=Focus(("nanogpt",), ("adamw",), ("drawn",)))
    # the sweep's own shape and parts, shortened to 30 steps at a safe LR
    config = dataclasses.replace(drawn, steps=30, warmup_steps=5, lr=3e-3, seq_len=32)
    frame, meta = read_run(run_real(config, tmp_path / "r.parquet", "r").path)
    for field in ("block", "norm", "positions", "mlp", "tied", "pre_ln", "n_head"):
        assert meta.config[field] == getattr(drawn, field), field
    assert meta.config["family"] == "drawn" and meta.config["recipe"] == "nanogpt"
    assert len(frame) == 30 and frame["attn_entropy_mean"].notna().any()
    assert frame["loss"].iloc[-5:].mean() < frame["loss"].iloc[:5].mean()
