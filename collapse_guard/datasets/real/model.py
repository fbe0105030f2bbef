"""A small decoder-only transformer with the knobs that make it unstable.

nanoGPT-shaped on purpose: readers know it. The knobs are the ones the literature ties to
small-scale instabilities: qk-layernorm (Wortsman et al. 2023, Dehghani et al. 2023),
pre-LN vs post-LN (Xiong et al. 2020), init scale. Attention goes through
``F.scaled_dot_product_attention`` so the probe can capture it without the model's help.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GPT", "GPTConfig"]


@dataclass
class GPTConfig:
    vocab_size: int = 256  # byte-level text
    seq_len: int = 64  # context length, tokens
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 64
    qk_norm: bool = False  # layernorm on q and k: the standard fix for attention-logit growth
    pre_ln: bool = True  # False gives post-LN, which needs warmup to train at all
    init_scale: float = 1.0  # multiplies the 0.02 std of every weight init
    dropout: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        if config.d_model % config.n_head:
            raise ValueError(
                f"d_model={config.d_model} is not divisible by n_head={config.n_head}; "
                "pick d_model as a multiple of n_head"
            )
        self.n_head = config.n_head
        self.head_dim = config.d_model // config.n_head
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.q_norm = nn.LayerNorm(self.head_dim) if config.qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim) if config.qk_norm else nn.Identity()
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        # (batch, seq, width) -> (batch, head, seq, head_dim)
        q, k, v = (
            t.view(batch, seq, self.n_head, self.head_dim).transpose(1, 2) for t in (q, k, v)
        )
        q, k = self.q_norm(q), self.k_norm(k)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        return self.proj(y.transpose(1, 2).reshape(batch, seq, width))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.pre_ln = config.pre_ln
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, 4 * config.d_model),
            nn.GELU(),
            nn.Linear(4 * config.d_model, config.d_model),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_ln:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.mlp(x))


class GPT(nn.Module):
    """Decoder-only transformer; ``forward(idx, targets)`` returns ``(logits, loss)``."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.seq_len, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model) if config.pre_ln else nn.Identity()
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self._init_weights(config.init_scale)

    def _init_weights(self, scale: float) -> None:
        std = 0.02 * scale
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        # GPT-2's residual scaling keeps the residual stream's variance flat with depth
        for block in self.blocks:
            nn.init.normal_(block.attn.proj.weight, std=std / math.sqrt(2 * self.config.n_layer))

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        seq = idx.shape[1]
        if seq > self.config.seq_len:
            raise ValueError(
                f"sequence has {seq} tokens, the model's context is {self.config.seq_len}; "
                "crop the batch or build the model with a larger seq_len"
            )
        positions = torch.arange(seq, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))
        return logits, loss
