"""Real runs: the breadth sweep (issue 34, item 2): Muon, every drawn part, larger nanogpt runs."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import Counter
from dataclasses import replace

import pytest
import torch

from collapse_guard.datasets.real import Focus, RealRunConfig, run_id_for, sample_configs
from collapse_guard.datasets.real.breadth import (
    LARGE_BATCH,
    LARGE_SHAPES,
    LARGE_STEP_SHARE,
    OPTIMIZER_SHARES,
    RECIPE_SHARES,
)
from collapse_guard.datasets.real.config import ARCHITECTURE_CHOICES, ATTENTIONS
from collapse_guard.datasets.real.models import build_model
from collapse_guard.datasets.real.models.layers import SelfAttention
from collapse_guard.datasets.real.optim import MuonAdamW, build_optimizer
from collapse_guard.datasets.real.runner import run_real
from collapse_guard.datasets.real.sampler import sample_config as sampler_config
from collapse_guard.runfiles import read_meta, read_run

BREADTH = Focus(breadth=True)
# the parts a breadth run draws each on its own (the drawn family's, attention, qk-norm)
PARTS = (*ARCHITECTURE_CHOICES, "pre_ln", "attention", "qk_norm")


@pytest.fixture(scope="module")
def breadth() -> list[RealRunConfig]:
    return sample_configs(600, seed=0, focus=BREADTH)


# --------------------------------------------------------------------------- other sweeps


def _fingerprint(configs: list[RealRunConfig]) -> str:
    assert {c.attention for c in configs} == {"mha"}  # no other sweep draws an attention
    rows = [{k: v for k, v in c.to_dict().items() if k != "attention"} for c in configs]
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]


@pytest.mark.parametrize(
    ("n", "seed", "focus", "expected"),
    [
        # computed with the sampler before the breadth sweep (commit c6f45da): the seed-0
        # sweep running into corpus/real, another seed, and three top-ups keep every draw
        (400, 0, None, "77271e9e865cd306"),
        (100, 1, None, "e75052a5de3f4f99"),
        (100, 0, Focus(("nanogpt",), ("adamw",), ("drawn",)), "5c8de52891f28af6"),
        (100, 1, Focus(("constant_high", "slow_ramp"), ("lion", "sgd")), "b13e4c9a136bb6c9"),
        (100, 0, Focus(families=("drawn",)), "2e1c3b0f522647a6"),
    ],
)
def test_existing_sweeps_draw_what_they_drew_before(n, seed, focus, expected):
    assert _fingerprint(sample_configs(n, seed=seed, focus=focus)) == expected


def test_breadth_runs_have_ids_of_their_own():
    assert run_id_for(0, 7, BREADTH) == "real-s0-breadth-00007"
    assert run_id_for(2, 1, Focus(optimizers=("muon",), breadth=True)) == (
        "real-s2-breadth.all.muon-00001"
    )
    assert sample_configs(3, seed=0, focus=BREADTH)[2] == sample_configs(5, 0, focus=BREADTH)[2]
    with pytest.raises(ValueError, match="breadth sweep is drawn by"):
        sampler_config(0, 0, focus=BREADTH)  # the sampler alone would draw its own sweep


# --------------------------------------------------------------------------- breadth draws


@pytest.mark.parametrize(
    ("field", "shares"), [("optimizer", OPTIMIZER_SHARES), ("recipe", RECIPE_SHARES)]
)
def test_breadth_holds_each_optimizer_and_recipe_in_its_share(breadth, field, shares):
    for n in (100, len(breadth)):
        counts = Counter(getattr(c, field) for c in breadth[:n])
        for name, share in shares.items():
            # Kronecker stratification: measured at most 6 runs off in 600 (Muon's and
            # AdamW's 0.35 against the alpha of the optimizer stream), against
            # sqrt(n p (1 - p)) ~ 9-12 for independent draws
            assert abs(counts[name] - share * n) <= 0.01 * n + 1.5, (n, name, counts)


def test_every_part_is_drawn_independently_of_the_others_and_of_the_recipe(breadth):
    assert {c.family for c in breadth} == {"drawn"}
    for field in PARTS:
        values = {getattr(c, field) for c in breadth}
        assert len(values) >= 2, field
    for first, second in itertools.combinations(PARTS, 2):
        pairs = Counter((getattr(c, first), getattr(c, second)) for c in breadth)
        a = Counter(getattr(c, first) for c in breadth)
        b = Counter(getattr(c, second) for c in breadth)
        assert len(pairs) == len(a) * len(b), (first, second)  # every combination is there
        for (x, y), count in pairs.items():
            # independent: each cell within 6 standard deviations of n p(x) p(y)
            expected = a[x] * b[y] / len(breadth)
            assert abs(count - expected) <= 6 * expected**0.5 + 2, (first, second, x, y)
    assert set(ATTENTIONS) == {c.attention for c in breadth}
    # qk-norm is not the recipe's: collapse recipes that turn it off elsewhere get it half the time
    for recipe in ("constant_high", "slow_ramp", "safe_high_lr", "nanogpt"):
        runs = [c for c in breadth if c.recipe == recipe]
        assert 0.25 <= sum(c.qk_norm for c in runs) / len(runs) <= 0.75, recipe


def test_breadth_draws_muon_with_its_own_knobs_and_edge(breadth):
    muon = [c for c in breadth if c.optimizer == "muon"]
    assert {c.beta1 for c in muon} == {0.9, 0.95} and {c.beta2 for c in muon} == {0.95, 0.99}
    assert {c.recipe for c in muon} == set(RECIPE_SHARES)  # ramps, re-warms and healthy ones
    assert {c.fault for c in muon} >= {"lr_ramp", "lr_jump", "grad_spike", "corrupt_ramp"}
    assert "opt_reset" not in {c.fault for c in muon}  # no second moment on the matrices


def test_nanogpt_breadth_runs_are_larger_models_within_three_minutes(breadth):
    runs = [c for c in breadth if c.recipe == "nanogpt"]
    assert {(c.n_layer, c.d_model, c.seq_len) for c in runs} == set(LARGE_SHAPES)
    assert {c.batch_size for c in runs} == {LARGE_BATCH}
    for c in runs:
        assert round(1500 * LARGE_STEP_SHARE) <= c.steps <= round(2500 * LARGE_STEP_SHARE)
        assert 0.015 * c.steps <= c.warmup_steps <= 0.105 * c.steps
        assert c.lr_at(c.steps - 1) == pytest.approx(0.1 * c.lr, rel=1e-3)
    assert {c.optimizer for c in runs} == set(OPTIMIZER_SHARES)
    others = [c for c in breadth if c.recipe != "nanogpt"]
    assert max(c.d_model for c in others) <= 96


def test_muon_is_drawn_by_a_focused_top_up_and_refused_where_it_has_no_second_moment():
    focused = sample_configs(20, seed=0, focus=Focus(("slow_ramp",), ("muon",)))
    assert {c.optimizer for c in focused} == {"muon"}
    assert {c.family for c in focused} == {"gpt", "rope_swiglu", "mha"}
    with pytest.raises(ValueError, match="opt_reset zeroes second moments"):
        RealRunConfig(optimizer="muon", fault="opt_reset")
    with pytest.raises(ValueError, match="family 'gpt' is built with attention='mha'"):
        RealRunConfig(family="gpt", attention="gqa")
    old_file = {k: v for k, v in RealRunConfig().to_dict().items() if k != "attention"}
    assert RealRunConfig.from_dict(old_file).attention == "mha"  # files before the breadth


# --------------------------------------------------------------------------- Muon, attention


def _tiny_drawn(**parts) -> torch.nn.Module:
    config = RealRunConfig(
        family="drawn", n_layer=1, d_model=16, seq_len=8, vocab_size=64, data="language", **parts
    )
    torch.manual_seed(0)
    return build_model("drawn", config.model_config())


@pytest.mark.parametrize("tied", [False, True])
def test_muon_takes_the_hidden_matrices_and_adamw_the_rest(tied):
    model = _tiny_drawn(tied=tied)
    optimizer = build_optimizer(RealRunConfig(optimizer="muon", weight_decay=0.1), model)
    assert isinstance(optimizer, MuonAdamW)
    names = {id(p): n for n, p in model.named_parameters()}
    muon = [names[id(p)] for g in optimizer.muon.param_groups for p in g["params"]]
    adamw = [names[id(p)] for g in optimizer.adamw.param_groups for p in g["params"]]
    assert sorted(muon) == sorted(
        n for n, p in model.named_parameters() if p.dim() == 2 and n.startswith("blocks.")
    )
    assert {"tok_emb.weight", "pos_emb.weight"} <= set(adamw)
    assert ("head.weight" in adamw) is not tied  # tied: the head is the embedding
    assert len(muon) + len(adamw) == len(list(model.parameters()))
    assert optimizer.param_groups[0] is optimizer.muon.param_groups[0]  # the probe's lr


def test_muon_adamw_steps_as_torchs_muon_and_adamw_side_by_side():
    model, twin = _tiny_drawn(), _tiny_drawn()
    config = RealRunConfig(optimizer="muon", lr=0.02, warmup_steps=1, beta1=0.9, beta2=0.99)
    ours = build_optimizer(config, model)
    hidden = [p for n, p in twin.named_parameters() if p.dim() == 2 and n.startswith("blocks.")]
    rest = [p for p in twin.parameters() if all(p is not h for h in hidden)]
    muon = torch.optim.Muon(
        hidden, lr=0.02, momentum=0.9, weight_decay=0.1, adjust_lr_fn="match_rms_adamw"
    )
    decay = [p for p in rest if p.dim() == 2]
    adamw = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": 0.1},
            {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=0.02,
        betas=(0.9, 0.99),
    )
    x = torch.randint(0, 64, (4, 8))
    for _ in range(3):
        for net, step in ((model, ours.step), (twin, lambda: (muon.step(), adamw.step()))):
            _, loss = net(x[:, :-1], x[:, 1:])
            loss.backward()
            step()
            net.zero_grad()
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    assert len(ours.state) == len(list(model.parameters()))  # both halves' state
    restored = build_optimizer(config, _tiny_drawn())
    restored.load_state_dict(ours.state_dict())
    muon_state = restored.state_dict()["optimizers"][0]["state"]
    assert muon_state.keys() == ours.muon.state_dict()["state"].keys()


def test_an_lr_set_after_a_restore_reaches_muon_and_adamw():
    model = _tiny_drawn()
    optimizer = build_optimizer(RealRunConfig(optimizer="muon", lr=0.02), model)
    saved = optimizer.state_dict()
    for group in optimizer.param_groups:
        group["lr"] = 0.5  # the state's LR differs from the one set after the restore
    optimizer.load_state_dict(saved)
    stored = [g["lr"] for half in saved["optimizers"] for g in half["param_groups"]]
    assert [g["lr"] for g in optimizer.param_groups] == stored != [0.5] * len(stored)
    for group in optimizer.param_groups:
        group["lr"] = 0.0  # a rollback's cap, a schedule's step
    assert [g["lr"] for g in optimizer.muon.param_groups + optimizer.adamw.param_groups] == [
        0.0
    ] * len(optimizer.param_groups)
    x = torch.randint(0, 64, (4, 8))
    before = [p.detach().clone() for p in model.parameters()]
    _, loss = model(x[:, :-1], x[:, 1:])
    loss.backward()
    optimizer.step()
    for old, new in zip(before, model.parameters(), strict=True):
        torch.testing.assert_close(old, new)  # at LR 0 nothing moves, weight decay included


def test_grouped_query_attention_is_multi_head_attention_with_shared_keys_and_values():
    torch.manual_seed(0)
    gqa = SelfAttention(16, 4, qk_norm=False, n_kv_head=2)  # 4 query heads, 2 kv heads
    mha = SelfAttention(16, 4, qk_norm=False)

    def repeated(t):  # each kv head's 4 rows, once for each of its 2 query heads
        return t.view(2, 4, *t.shape[1:]).repeat_interleave(2, dim=0).reshape(16, *t.shape[1:])

    with torch.no_grad():
        q, k, v = gqa.q_proj, gqa.k_proj, gqa.v_proj
        mha.qkv.weight.copy_(torch.cat((q.weight, repeated(k.weight), repeated(v.weight))))
        mha.qkv.bias.copy_(torch.cat((q.bias, repeated(k.bias), repeated(v.bias))))
        mha.proj.load_state_dict(gqa.proj.state_dict())
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(gqa(x), mha(x))
    assert (gqa.k_proj.weight.shape, gqa.v_proj.weight.shape) == ((8, 16), (8, 16))
    mqa = _tiny_drawn(attention="mqa", n_head=4)
    assert mqa.blocks[0].attn.k_proj.weight.shape == (4, 16)  # one head of 4 dims
    # the guard's qk-clip finds the layout: 4 query heads over 1 key head
    from collapse_guard.guard.qk_clip import find_layout

    layout = find_layout(mqa.blocks[0].attn, 4)
    assert (layout.n_heads, layout.n_kv_heads, layout.head_dim) == (4, 1, 4)


# --------------------------------------------------------------------------- runs

TINY = {"n_layer": 1, "d_model": 32, "seq_len": 32, "batch_size": 4}


def _first(recipe: str, optimizer: str) -> RealRunConfig:
    """The breadth sweep's first run of ``recipe`` with ``optimizer`` (seed 0)."""
    focus = Focus((recipe,), (optimizer,), breadth=True)
    return sample_configs(1, seed=0, focus=focus)[0]


def _recorded(config: RealRunConfig, tmp_path):
    result = run_real(config, tmp_path / "r.parquet", "r")
    frame, meta = read_run(result.path)
    assert RealRunConfig.from_dict(meta.config) == config
    assert meta.label_version is not None and meta.extra["steps_run"] == len(frame)
    return result, frame, meta


def test_a_short_muon_run_trains_records_its_lr_and_stays_healthy(tmp_path):
    config = replace(
        _first("slow_ramp", "muon"), steps=60, warmup_steps=5, rewarm_step=0, lr=0.02, **TINY
    )
    assert (config.optimizer, config.family) == ("muon", "drawn")
    result, frame, meta = _recorded(config, tmp_path)
    assert result.onset_step is None and meta.extra["onset_kind"] is None
    assert frame["loss"].iloc[-5:].mean() < frame["loss"].iloc[:5].mean() - 0.3
    # the probe reads the LR off Muon's group: the schedule, step by step
    assert frame["lr"].tolist() == pytest.approx([config.lr_at(s) for s in range(60)])
    assert frame["grad_norm"].notna().all()
    assert frame.loc[frame["step"] == 50, "attn_entropy_mean"].notna().all()


def test_a_muon_lr_jump_is_labelled_a_sudden_collapse_at_the_jump(tmp_path):
    config = RealRunConfig(
        optimizer="muon",
        family="drawn",
        steps=120,
        warmup_steps=10,
        lr=0.005,
        fault="lr_jump",
        fault_step=60,
        fault_scale=200.0,
        **TINY,
    )
    result, _, meta = _recorded(config, tmp_path)
    assert 60 <= result.onset_step <= 69 and meta.extra["onset_kind"] == "sudden"
    assert result.cause == "fault_lr_jump"


def test_a_short_large_adamw_nanogpt_run_trains_records_and_labels(tmp_path):
    config = replace(_first("nanogpt", "adamw"), steps=30)
    assert config.n_layer >= 4 and config.d_model >= 128 and config.batch_size == LARGE_BATCH
    result, frame, meta = _recorded(config, tmp_path)
    assert meta.config["n_layer"] == config.n_layer and len(frame) == 30
    assert frame["loss"].iloc[-5:].mean() < frame["loss"].iloc[:5].mean()
    assert result.onset_step is None  # 30 steps of warmup: nothing to collapse yet


def test_data_real_sweep_breadth_writes_its_runs_and_refuses_an_unknown_sweep(tmp_path):
    from typer.testing import CliRunner

    from collapse_guard.datasets.cli import app

    args = ["real", "--n", "1", "--steps", "20", "--workers", "1", "--out", str(tmp_path)]
    made = CliRunner().invoke(app, [*args, "--sweep", "breadth", "--optimizers", "muon"])
    assert made.exit_code == 0, made.output
    (path,) = tmp_path.glob("*.parquet")
    assert path.name == "real-s0-breadth.all.muon-00000.parquet"
    assert read_meta(path).config["optimizer"] == "muon"
    refused = CliRunner().invoke(app, [*args, "--sweep", "wide"])
    assert refused.exit_code == 2
    assert refused.output.strip().splitlines() == [
        "error: unknown sweep 'wide'; expected one of main, breadth"
    ]
