"""Layers the model families share: attention through SDPA, rotary and ALiBi positions, the MLPs.

Every family's attention ends in ``F.scaled_dot_product_attention`` (looked up on
``F`` at call time, so the probe's capture sees it) or in ``nn.MultiheadAttention``
(which the probe steers onto the same function): no family needs the probe's help.
ALiBi's bias goes to SDPA as an additive ``attn_mask`` (with the causal mask folded in),
which the probe's capture adds to the logits as SDPA does.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ALiBi", "ResidualBlock", "Rotary", "SelfAttention", "SwiGLU", "gelu_mlp"]


class Rotary(nn.Module):
    """Rotary position embedding (Su et al. 2021) on the two halves of each head's dims."""

    def __init__(self, head_dim: int, seq_len: int, base: float = 10_000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(
                f"rotary positions need an even head dimension, got {head_dim}; "
                "pick d_model / n_head even"
            )
        half = head_dim // 2
        inverse = base ** (-torch.arange(half, dtype=torch.float32) / half)
        angles = torch.arange(seq_len, dtype=torch.float32)[:, None] * inverse[None, :]
        # buffers, not parameters: no gradient, no optimizer state, moved with the model
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` (batch, head, seq, head_dim) by its positions."""
        seq = x.shape[-2]
        cos, sin = self.cos[:seq], self.sin[:seq]
        first, second = x.chunk(2, dim=-1)
        return torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)


class ALiBi(nn.Module):
    """Attention with linear biases (Press et al. 2022): no position embedding; each head
    subtracts ``slope * distance`` from its logits, with slopes a geometric series.

    ``forward(seq)`` is the additive mask for SDPA, (head, seq, seq): the bias on the
    keys a query may see, ``-inf`` on the later ones (so SDPA runs without ``is_causal``).
    """

    def __init__(self, n_head: int, seq_len: int):
        super().__init__()
        # the paper's slopes 2^(-8 h / n) for h = 1..n (exact for powers of two; a smooth
        # series in between, which is all the bias needs)
        slopes = 2.0 ** (-8.0 * torch.arange(1, n_head + 1, dtype=torch.float32) / n_head)
        position = torch.arange(seq_len, dtype=torch.float32)
        distance = position[:, None] - position[None, :]  # query i, key j: i - j
        bias = -slopes[:, None, None] * distance
        bias = bias.masked_fill(distance < 0, -math.inf)
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, seq: int) -> torch.Tensor:
        return self.bias[:, :seq, :seq]


class SelfAttention(nn.Module):
    """Causal multi-head self-attention: one qkv projection, optional qk-norm and rotary.

    ``n_kv_head`` below ``n_head`` shares each key/value head among a group of query heads
    (grouped-query attention; 1: multi-query), repeated to every head before SDPA, as
    Llama's ``repeat_kv`` does, so the probe's capture sees ordinary heads. Such a layer
    projects as Llama does, ``q_proj``, ``k_proj`` and ``v_proj`` apart (the guard's
    qk-clip reads its key/value heads from them; a fused ``qkv`` reads as thirds).

    ``norm`` builds the qk-norm layer (LayerNorm for the GPT, RMSNorm for the rotary
    family); ``qk_norm=False`` leaves q and k as projected, which lets attention logits
    grow without bound at high LR (Wortsman et al. 2023). ``alibi`` biases the logits by
    distance instead of rotating q and k.
    """

    def __init__(
        self,
        d_model: int,
        n_head: int,
        *,
        qk_norm: bool,
        norm: type[nn.Module] = nn.LayerNorm,
        rotary: Rotary | None = None,
        alibi: ALiBi | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        n_kv_head: int | None = None,
    ):
        super().__init__()
        n_kv_head = n_kv_head or n_head
        if d_model % n_head or n_head % n_kv_head:
            raise ValueError(
                f"d_model={d_model} must be a multiple of n_head={n_head}, and n_head of "
                f"n_kv_head={n_kv_head}; pick them so"
            )
        self.n_head, self.n_kv_head = n_head, n_kv_head
        self.head_dim = d_model // n_head
        if n_kv_head == n_head:
            self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        else:
            kv_width = n_kv_head * self.head_dim
            self.q_proj = nn.Linear(d_model, d_model, bias=bias)
            self.k_proj = nn.Linear(d_model, kv_width, bias=bias)
            self.v_proj = nn.Linear(d_model, kv_width, bias=bias)
        self.proj = nn.Linear(d_model, d_model, bias=bias)
        self.q_norm = norm(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = norm(self.head_dim) if qk_norm else nn.Identity()
        self.rotary = rotary
        self.alibi = alibi
        self.dropout = dropout

    @property
    def out_projection(self) -> nn.Linear:
        """The layer that writes into the residual stream (GPT-2 scales its init)."""
        return self.proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        if self.n_kv_head == self.n_head:
            q, k, v = self.qkv(x).split(width, dim=2)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        # (batch, seq, heads * head_dim) -> (batch, heads, seq, head_dim)
        q, k, v = (t.view(batch, seq, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        q, k = self.q_norm(q), self.k_norm(k)
        if self.n_kv_head < self.n_head:
            group = self.n_head // self.n_kv_head
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        # looked up on F at call time: the probe's capture replaces it there
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=None if self.alibi is None else self.alibi(seq),
            is_causal=self.alibi is None,
            dropout_p=self.dropout if self.training else 0.0,
        )
        return self.proj(y.transpose(1, 2).reshape(batch, seq, width))


def gelu_mlp(d_model: int) -> nn.Sequential:
    """GPT-2's MLP: 4x wide, GELU (a Sequential: its parameter names are ``0`` and ``2``)."""
    return nn.Sequential(
        nn.Linear(d_model, 4 * d_model),
        nn.GELU(),
        nn.Linear(4 * d_model, d_model),
    )


class SwiGLU(nn.Module):
    """Gated MLP of Llama (Shazeer 2020): ``down(silu(gate(x)) * up(x))``, no biases.

    The hidden width is 8/3 of the model's, rounded up to a multiple of 8, so that its
    parameter count matches a 4x GELU MLP's.
    """

    def __init__(self, d_model: int):
        super().__init__()
        hidden = 8 * math.ceil(8 * d_model / 3 / 8)
        self.gate_up = nn.Linear(d_model, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class ResidualBlock(nn.Module):
    """One transformer block: attention then MLP, each in a residual branch with a norm.

    Pre-norm (``x + f(norm(x))``, GPT-2 and later) or post-norm (``norm(x + f(x))``,
    the original Transformer, which diverges at high LR without warmup: Xiong et al.
    2020). ``parallel`` (GPT-J, GPT-NeoX, PaLM) adds attention and MLP of the same input:
    ``x + attn(ln1(x)) + mlp(ln2(x))``, or post-norm ``ln1(x + attn(x) + mlp(x))`` (one
    norm: ``ln2`` is an identity). The parts are built in the order ``ln1, attn, ln2,
    mlp``: the seeded init draws in that order.
    """

    def __init__(
        self,
        d_model: int,
        attention: Callable[[], nn.Module],
        mlp: Callable[[], nn.Module],
        *,
        norm: Callable[[int], nn.Module] = nn.LayerNorm,
        pre_ln: bool = True,
        parallel: bool = False,
    ):
        super().__init__()
        self.pre_ln = pre_ln
        self.parallel = parallel
        self.ln1 = norm(d_model)
        self.attn = attention()
        # an unused norm would hold parameters that never get a gradient
        self.ln2 = nn.Identity() if parallel and not pre_ln else norm(d_model)
        self.mlp = mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.parallel and self.pre_ln:
            return x + self.attn(self.ln1(x)) + self.mlp(self.ln2(x))
        if self.parallel:
            return self.ln1(x + self.attn(x) + self.mlp(x))
        if self.pre_ln:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.mlp(x))
