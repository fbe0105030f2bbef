"""Per-head QK-clip: each layout clipped by the exact factor, the other heads untouched.

Every check of a clipped logit recomputes it here, in float64, from the q and k the
model itself hands to ``F.scaled_dot_product_attention`` (``_true_head_max``), not from
the probe's capture that the plan was made from.
"""

from __future__ import annotations

import contextlib
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from guard_helpers import Loop, tiny_model
from torch import nn

from collapse_guard.datasets.real.models.layers import SelfAttention
from collapse_guard.guard import Guard
from collapse_guard.guard.qk_clip import QKClip, QKLayout, find_layout, head_factors
from collapse_guard.probe.capture import capture_attention, isolated

TAU = 100.0
WIDTH, HEADS, SEQ = 16, 4, 6


@contextlib.contextmanager
def _true_logits():
    """Every SDPA call's per-head largest logit, recomputed in float64."""
    found: list[torch.Tensor] = []
    original = F.scaled_dot_product_attention

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
        q64, k64 = q.double(), k.double()
        if kw.get("enable_gqa") and k64.size(-3) != q64.size(-3):
            k64 = k64.repeat_interleave(q64.size(-3) // k64.size(-3), dim=-3)
        logits = q64 @ k64.transpose(-2, -1) * (scale or 1 / math.sqrt(q64.size(-1)))
        allowed = torch.ones(logits.shape[-2:], dtype=torch.bool)
        if is_causal:
            allowed = allowed.tril()
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            allowed = allowed & attn_mask
        elif attn_mask is not None:
            logits = logits + attn_mask.double()
        logits = logits.masked_fill(~allowed, -math.inf)
        found.append(logits.reshape(-1, logits.size(-3), logits[0, 0].numel()).amax(dim=(0, 2)))
        return original(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, **kw)

    F.scaled_dot_product_attention = sdpa
    try:
        with torch.no_grad():
            yield found
    finally:
        F.scaled_dot_product_attention = original


def _head_max(model: nn.Module, run) -> torch.Tensor:
    with _true_logits() as found:
        run(model)
    return torch.cat(found)


def _clip(model: nn.Module, run, tau: float = TAU, mapping=None) -> list[str]:
    """One probe-side pass (the probe's capture), the plan, and its application."""
    with isolated(model), capture_attention(model) as sink:
        run(model)
    clip = QKClip(model, tau, mapping)
    return clip.apply(clip.plan(sink))


def _grow_head(q_rows: torch.Tensor, k_rows: torch.Tensor, by: float = 12.0) -> None:
    """Make one head's logits large: its q and k rows x ``by`` (logits x by^2)."""
    with torch.no_grad():
        q_rows.mul_(by)
        k_rows.mul_(by)


def _assert_clipped(model, run, head: int, snapshot: dict, touched: set[str]) -> None:
    """``head`` now peaks at tau; every parameter outside ``touched`` is bit-identical,
    and inside them only the rows of that head moved (checked by the caller's rows)."""
    after = _head_max(model, run)
    assert after[head].item() == pytest.approx(TAU, abs=1e-4)
    for name, p in model.named_parameters():
        if name not in touched:
            assert torch.equal(p, snapshot[name]), name


def _rows_moved(before: torch.Tensor, after: torch.Tensor) -> set[int]:
    return {int(i) for i in (before != after).reshape(before.size(0), -1).any(1).nonzero()}


# ---------------------------------------------------------------- layouts
class NanoAttention(nn.Module):
    """nanoGPT's CausalSelfAttention: one c_attn [q; k; v], heads contiguous."""

    def __init__(self) -> None:
        super().__init__()
        self.c_attn = nn.Linear(WIDTH, 3 * WIDTH)
        self.c_proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (
            z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in self.c_attn(x).split(c, 2)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class GroupedAttention(nn.Module):
    """Separate q_proj / k_proj with 4 q heads over 2 k heads (Llama's repeat_kv)."""

    def __init__(self, kv_heads: int = 2, names: tuple[str, str] = ("q_proj", "k_proj")) -> None:
        super().__init__()
        self.d, self.kv = WIDTH // HEADS, kv_heads
        setattr(self, names[0], nn.Linear(WIDTH, WIDTH, bias=True))
        setattr(self, names[1], nn.Linear(WIDTH, kv_heads * self.d, bias=True))
        self.v_proj = nn.Linear(WIDTH, kv_heads * self.d)
        self.names = names

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q_proj, k_proj = (getattr(self, n) for n in self.names)
        q = q_proj(x).view(b, t, HEADS, self.d).transpose(1, 2)
        k, v = (p(x).view(b, t, self.kv, self.d).transpose(1, 2) for p in (k_proj, self.v_proj))
        k, v = (z.repeat_interleave(HEADS // self.kv, dim=1) for z in (k, v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class FusedGroupedAttention(nn.Module):
    """One ``c_attn`` [q; k; v] of 4 q heads over ``n_kv_head`` = 2 k and v heads (the
    shape a grouped-query nanoGPT fork writes)."""

    def __init__(self) -> None:
        super().__init__()
        self.n_kv_head, self.d = 2, WIDTH // HEADS
        self.c_attn = nn.Linear(WIDTH, WIDTH + 2 * self.n_kv_head * self.d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        kv = self.n_kv_head * self.d
        q, k, v = self.c_attn(x).split([WIDTH, kv, kv], dim=2)
        q = q.view(b, t, HEADS, self.d).transpose(1, 2)
        k, v = (z.view(b, t, self.n_kv_head, self.d).transpose(1, 2) for z in (k, v))
        k, v = (z.repeat_interleave(HEADS // self.n_kv_head, dim=1) for z in (k, v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _x(seed: int = 0) -> torch.Tensor:
    return torch.randn(2, SEQ, WIDTH, generator=torch.Generator().manual_seed(seed))


def _forward(model: nn.Module) -> None:
    model(_x())


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_fused_c_attn_head_is_clipped_to_tau_and_nothing_else_moves():
    torch.manual_seed(0)
    model = NanoAttention()
    d = WIDTH // HEADS
    w = model.c_attn.weight.data
    _grow_head(w[2 * d : 3 * d], w[WIDTH + 2 * d : WIDTH + 3 * d])  # head 2 of q and of k
    before = _head_max(model, _forward)
    assert before[2] > 1.2 * TAU and (before[[0, 1, 3]] < TAU).all()
    snapshot = _snapshot(model)
    events = _clip(model, _forward)
    assert len(events) == 1 and events[0].startswith("qk_clip:.2x")
    assert float(events[0].split("x")[-1]) == pytest.approx(TAU / before[2].item(), rel=1e-3)
    _assert_clipped(model, _forward, 2, snapshot, {"c_attn.weight", "c_attn.bias"})
    head_q = set(range(2 * d, 3 * d))
    assert _rows_moved(snapshot["c_attn.weight"], model.c_attn.weight) == head_q | {
        WIDTH + r for r in head_q
    }  # head 2's q rows and k rows; v untouched
    assert _rows_moved(snapshot["c_attn.bias"], model.c_attn.bias) <= head_q | {
        WIDTH + r for r in head_q
    }
    factor = math.sqrt(TAU / before[2].item())  # each side by sqrt(tau / S)
    ratio = model.c_attn.weight[2 * d] / snapshot["c_attn.weight"][2 * d]
    assert torch.allclose(ratio, torch.full_like(ratio, factor), rtol=1e-4)


def test_a_fused_grouped_query_c_attn_is_split_by_its_kv_heads_not_in_thirds():
    torch.manual_seed(0)
    model = FusedGroupedAttention()
    d = model.d  # 4; rows 16 + 8 + 8 = 32, which thirds would not split into 4 heads
    w = model.c_attn.weight.data
    with torch.no_grad():  # q head 2 x40, its k head 1 x10 (q head 3 reads it too: x10)
        w[2 * d : 3 * d].mul_(40.0)
        w[WIDTH + d : WIDTH + 2 * d].mul_(10.0)
    before = _head_max(model, _forward)
    assert before[2] > 1.2 * TAU and (before[[0, 1, 3]] < TAU).all()
    snapshot = _snapshot(model)
    events = _clip(model, _forward)  # head 3 reads the k head clipped: its logits scale too
    assert [e.rsplit("x", 1)[0] for e in events] == ["qk_clip:.2", "qk_clip:.3"]
    _assert_clipped(model, _forward, 2, snapshot, {"c_attn.weight", "c_attn.bias"})
    moved = _rows_moved(snapshot["c_attn.weight"], model.c_attn.weight)
    assert moved == set(range(2 * d, 3 * d)) | set(range(WIDTH + d, WIDTH + 2 * d))  # no v row
    model.n_kv_head = 3  # a count that does not split the rows: not clipped, and why
    assert find_layout(model, HEADS) == "c_attn has 32 outputs: not [q; k; v] of 4 q and 3 kv heads"


def test_project_self_attention_qkv_is_clipped_and_qk_norm_is_refused():
    torch.manual_seed(1)
    model = SelfAttention(WIDTH, HEADS, qk_norm=False)
    d = WIDTH // HEADS
    w = model.qkv.weight.data
    _grow_head(w[0:d], w[WIDTH : WIDTH + d], by=20.0)  # head 0
    snapshot = _snapshot(model)
    assert _head_max(model, _forward)[0] > TAU
    _clip(model, _forward)
    _assert_clipped(model, _forward, 0, snapshot, {"qkv.weight", "qkv.bias"})

    normed = SelfAttention(WIDTH, HEADS, qk_norm=True)
    with torch.no_grad():
        normed.q_norm.weight.mul_(80.0)  # logits past tau that W_q cannot reach
    assert _head_max(normed, _forward).amax() > TAU
    snapshot = _snapshot(normed)
    with pytest.warns(RuntimeWarning, match="qk-norm"):
        assert _clip(normed, _forward) == []
    assert all(torch.equal(p, snapshot[n]) for n, p in normed.named_parameters())


def test_multihead_attention_in_proj_weight_is_clipped():
    torch.manual_seed(2)
    model = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)
    d = WIDTH // HEADS
    w = model.in_proj_weight.data
    _grow_head(w[3 * d : 4 * d], w[WIDTH + 3 * d : WIDTH + 4 * d])  # head 3

    def run(m: nn.Module) -> None:
        x = _x()
        m(x, x, x, need_weights=False)

    model.train()  # the fused fast path is for eval only: SDPA is called in train
    before = _head_max(model, run)
    assert before[3] > TAU and (before[:3] < TAU).all()
    snapshot = _snapshot(model)
    events = _clip(model, run)
    assert [e.rsplit("x", 1)[0] for e in events] == ["qk_clip:.3"]
    _assert_clipped(model, run, 3, snapshot, {"in_proj_weight", "in_proj_bias"})
    moved = _rows_moved(snapshot["in_proj_weight"], model.in_proj_weight)
    assert moved == set(range(3 * d, 4 * d)) | set(range(WIDTH + 3 * d, WIDTH + 4 * d))


def test_grouped_query_heads_all_end_at_or_under_tau():
    """k head 0 serves q heads 0 and 1: head 0 exceeds most, head 1 less, head 2 (the
    other group) not at all. The rule: k by its most-exceeding q head's factor, each
    q head over tau by its own; so head 0 lands on tau, head 1 under it, and the other
    group is bit-identical."""
    torch.manual_seed(3)
    model = GroupedAttention()
    d = model.d
    with torch.no_grad():
        model.k_proj.weight[:d].mul_(30.0)
        model.q_proj.weight[:d].mul_(30.0)  # head 0: x900
        model.q_proj.weight[d : 2 * d].mul_(15.0)  # head 1: x450
    before = _head_max(model, _forward)
    assert before[0] > before[1] > TAU and (before[2:] < TAU).all(), before
    snapshot = _snapshot(model)
    events = _clip(model, _forward)
    after = _head_max(model, _forward)
    assert after[0].item() == pytest.approx(TAU, abs=1e-4)
    expected_1 = TAU * math.sqrt(before[1].item() / before[0].item())
    assert after[1].item() == pytest.approx(expected_1, rel=1e-6) and after[1] < TAU
    assert torch.equal(after[2:], before[2:])
    assert [e.rsplit("x", 1)[0] for e in events] == ["qk_clip:.0", "qk_clip:.1"]
    assert _rows_moved(snapshot["k_proj.weight"], model.k_proj.weight) == set(range(d))
    assert _rows_moved(snapshot["q_proj.weight"], model.q_proj.weight) == set(range(2 * d))
    for name in ("v_proj.weight", "v_proj.bias"):
        assert torch.equal(getattr(model.v_proj, name.split(".")[1]), snapshot[name])


def test_transformers_llama_is_clipped_through_the_mapping():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        attn_implementation="sdpa",
    )
    torch.manual_seed(4)
    model = transformers.LlamaForCausalLM(config).double()
    attn = model.model.layers[1].self_attn
    d = 32 // 4
    with torch.no_grad():
        attn.q_proj.weight[2 * d : 3 * d].mul_(80.0)  # layer 1, q head 2 (k head 1)
        attn.k_proj.weight[d : 2 * d].mul_(80.0)
    ids = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(0))

    def run(m: nn.Module) -> None:
        m(input_ids=ids)

    before = _head_max(model, run)  # 2 layers x 4 heads
    assert before[4 + 2] > TAU and (before[:4] < TAU).all(), before
    snapshot = _snapshot(model)
    events = _clip(model, run)
    after = _head_max(model, run)
    assert after[6].item() == pytest.approx(TAU, abs=1e-4)
    assert (after <= TAU + 1e-4).all()
    assert events and all(e.startswith("qk_clip:model.layers.1.self_attn.") for e in events)
    touched = {"model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight"}
    for name, p in model.named_parameters():
        if name not in touched:
            assert torch.equal(p, snapshot[name]), name
    moved = _rows_moved(snapshot[sorted(touched)[0]], attn.k_proj.weight)
    assert moved == set(range(d, 2 * d))  # k head 1 only


def _gpt2(transformers):
    config = transformers.GPT2Config(
        vocab_size=40, n_positions=32, n_embd=32, n_layer=2, n_head=4, attn_implementation="sdpa"
    )
    model = transformers.GPT2LMHeadModel(config).double().eval()  # dropout 0.1 off
    weight = model.transformer.h[1].attn.c_attn.weight  # Conv1D: (in, [q; k; v] out)
    return model, "transformer.h.1.attn", [weight[:, 16:24], weight[:, 32 + 16 : 32 + 24]]


def _neox(transformers):
    config = transformers.GPTNeoXConfig(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=32,
        attn_implementation="sdpa",
    )
    model = transformers.GPTNeoXForCausalLM(config).double().eval()
    weight = model.gpt_neox.layers[1].attention.query_key_value.weight  # [q_h; k_h; v_h] per h
    return model, "gpt_neox.layers.1.attention", [weight[48:56], weight[56:64]]  # head 2


@pytest.mark.parametrize("build", [_gpt2, _neox], ids=["gpt2-conv1d", "gpt-neox"])
def test_transformers_fused_layouts_gpt2_and_neox(build):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(7)
    model, attention, (q_rows, k_rows) = build(transformers)
    with torch.no_grad():
        q_rows.mul_(80.0)  # layer 1, head 2
        k_rows.mul_(80.0)
    ids = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(0))

    def run(m: nn.Module) -> None:
        m(input_ids=ids)

    before = _head_max(model, run)
    assert before[6] > TAU and (before[:6] < TAU).all() and before[7] < TAU, before
    snapshot = _snapshot(model)
    events = _clip(model, run)
    after = _head_max(model, run)
    assert [e.rsplit("x", 1)[0] for e in events] == [f"qk_clip:{attention}.2"]
    assert after[6].item() == pytest.approx(TAU, abs=1e-4)
    assert torch.equal(after[[0, 1, 2, 3, 4, 5, 7]], before[[0, 1, 2, 3, 4, 5, 7]])
    fused = (f"{attention}.c_attn.", f"{attention}.query_key_value.")
    for name, p in model.named_parameters():
        if not name.startswith(fused):
            assert torch.equal(p, snapshot[name]), name


def test_unknown_layout_warns_once_and_a_user_mapping_clips_it():
    torch.manual_seed(5)
    model = GroupedAttention(kv_heads=4, names=("wq", "wk"))
    d = model.d
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every head under tau: no word of the layout
        assert _clip(model, _forward) == []
    _grow_head(model.wq.weight.data[d : 2 * d], model.wk.weight.data[d : 2 * d], by=15.0)
    assert _head_max(model, _forward)[1] > TAU
    snapshot = _snapshot(model)
    with pytest.warns(RuntimeWarning, match="not clipped: no q_proj/k_proj") as caught:
        assert _clip(model, lambda m: (m(_x()), m(_x(1)))) == []
    assert len([w for w in caught if "QK-clip" in str(w.message)]) == 1
    assert all(torch.equal(p, snapshot[n]) for n, p in model.named_parameters())

    for as_dict in (True, False):
        clipped = GroupedAttention(kv_heads=4, names=("wq", "wk"))
        clipped.load_state_dict(model.state_dict())
        q, k = clipped.wq, clipped.wk
        layout = QKLayout(q.weight, k.weight, HEADS, 4, d, q_bias=q.bias, k_bias=k.bias)
        mapping = {"": layout} if as_dict else (lambda name, module, found=layout: found)
        _clip(clipped, _forward, mapping=mapping)
        assert _head_max(clipped, _forward)[1].item() == pytest.approx(TAU, abs=1e-4)
        assert torch.equal(clipped.v_proj.weight, snapshot["v_proj.weight"])
        assert torch.equal(clipped.wq.weight[:d], snapshot["wq.weight"][:d])


def test_a_head_at_or_below_zero_is_floored_no_nan_no_change():
    for maxima in ([-5.0, 0.0, -math.inf, math.nan], [1e-12, -1e3, 50.0, TAU]):
        assert head_factors(torch.tensor(maxima), 2, TAU) is None
    # the heads under tau beside one over it: factor exactly 1, never NaN
    q, k = head_factors(torch.tensor([-5.0, -math.inf, math.nan, 400.0]), 2, TAU)
    assert q == [1.0, 1.0, 1.0, 0.5] and k == [1.0, 0.5]

    torch.manual_seed(6)
    model = NanoAttention()
    with torch.no_grad():
        model.c_attn.weight[: 2 * WIDTH].zero_()
        model.c_attn.bias[:WIDTH] = 1.0
        model.c_attn.bias[WIDTH : 2 * WIDTH] = -1.0  # q = 1, k = -1: every logit -2
    assert (_head_max(model, _forward) < 0).all()
    snapshot = _snapshot(model)
    assert _clip(model, _forward, tau=1e-9) == []  # under any positive tau
    assert all(torch.equal(p, snapshot[n]) for n, p in model.named_parameters())


# ---------------------------------------------------------------- guard
def _guarded(tmp_path, steps: int, mode: str, tau: float, risk="off"):
    model, optimizer = tiny_model(seed=0, lr=1e-2)
    loop = Loop(seed=0)
    config = {"qk_clip": mode, "qk_clip_tau": tau, "risk_every": 1}
    guard = Guard(model, optimizer, tmp_path, risk=risk, policy=config, preflight=False)
    for _ in range(steps):
        guard.step(loop.loss(model))
        optimizer.zero_grad()
    return guard, model


def test_guarded_loop_clips_records_events_and_keeps_state(tmp_path):
    from collapse_guard.runfiles import read_run

    # tau 0.01: the tiny GPT's heads peak over it from the start (measured: 0.03-0.6)
    guard, _ = _guarded(tmp_path, 21, "always", tau=0.01)
    guard.close()
    frame, meta = read_run(guard.run_path)
    clipped = frame[frame.event.str.contains("qk_clip:")]
    # probe passes at steps 0, 10, 20 (attention_every 10): applied after the next update
    assert clipped.step.tolist() == [1, 11]
    for event in ";".join(clipped.event).split(";"):
        if event.startswith("qk_clip:"):
            name, factor = event[len("qk_clip:") :].rsplit("x", 1)
            assert name.startswith("blocks.0.attn.") and 0 < float(factor) < 1
    assert meta.extra["guard"]["qk_clips"] == guard.qk_clips > 0
    assert guard.qk_pending  # step 20's plan, for step 21
    torch.save(guard.state_dict(), tmp_path / "state.pt")  # as a checkpoint holds it
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    again = Guard(
        *tiny_model(seed=1), tmp_path / "b", risk="off", policy=guard.policy, record=False
    )
    again.load_state_dict(state)
    assert again.qk_pending == guard.qk_pending and again.qk_clips == guard.qk_clips
    # resume from the ring (its newest checkpoint: after step 10, whose pass planned)
    resumed = Guard(*tiny_model(seed=1), tmp_path, risk="off", policy=guard.policy, record=False)
    with pytest.warns(RuntimeWarning, match="finished"):  # the run recorded steps 0-20:
        assert resumed.resume() == 21  # it goes on after them (issue 31, case 9)
    assert resumed.qk_pending and resumed.qk_clips == sum(
        e.startswith("qk_clip:") for s, e in guard.events if s <= 10
    )
    off, _ = _guarded(tmp_path / "off", 12, "off", tau=0.01)
    assert off.qk_clips == 0 and not any("qk_clip" in e for _, e in off.events)
    watch, _ = _guarded(tmp_path / "watch", 12, "watch", tau=0.01)  # risk off: level ok
    assert watch.qk_clips == 0


def test_watch_mode_clips_only_at_watch_and_above(tmp_path, fixed_risk):
    # the reading asked after step 0 holds from step 1: the pass of step 0 (at ok) plans
    # nothing; at watch the attention is probed every 5 steps, each pass's plan applied
    # after the next update
    guard, _ = _guarded(tmp_path, 17, "watch", tau=0.01, risk=fixed_risk("watch"))
    assert sorted({s for s, e in guard.events if e.startswith("qk_clip:")}) == [6, 11, 16]


def test_policy_rejects_an_unknown_mode_and_a_zero_tau():
    from collapse_guard.guard.policy import GuardPolicy

    with pytest.raises(ValueError, match="qk_clip must be one of"):
        GuardPolicy(qk_clip="sometimes")
    with pytest.raises(ValueError, match="qk_clip_tau must be > 0"):
        GuardPolicy(qk_clip_tau=0)
    with pytest.raises(TypeError, match="qk_clip_tau must be a number"):
        GuardPolicy(qk_clip_tau="100")


@pytest.mark.slow  # two spawned interpreters importing torch: 13 s quiet, 66 s loaded
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed missing")
def test_under_ddp_every_rank_applies_rank_0s_factors(tmp_path):
    import sys
    from pathlib import Path

    import torch.multiprocessing as mp

    sys.path.insert(0, str(Path(__file__).parent))
    from qk_ddp_worker import run_rank

    mp.start_processes(run_rank, args=(2, str(tmp_path)), nprocs=2, start_method="spawn")
    zero, one = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    assert zero["events"] == one["events"] and zero["events"]
    assert {e.split(":")[0] for e in zero["events"]} == {"1", "11", "21"}
    for name, value in zero["params"].items():
        assert torch.equal(value, one["params"][name]), name


def test_captures_of_a_user_attention_fn_are_named_in_the_warning():
    from collapse_guard.probe.capture import AttentionCapture

    bare = AttentionCapture(probs=torch.full((1, HEADS, SEQ, SEQ), 1 / SEQ))  # no modules
    with pytest.warns(RuntimeWarning, match="attention_fn returns no per-head logits"):
        assert QKClip(NanoAttention(), TAU).plan([bare]) == {}
