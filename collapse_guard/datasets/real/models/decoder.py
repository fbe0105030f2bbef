"""The decoder every family shares: embeddings, a stack of blocks, a final norm, a head.

A family is a block class plus three choices (learned or no position embedding,
tied or separate head, which norm): ``Decoder`` does the rest the same way for all,
including the seeded init, so families differ only where they are meant to.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Decoder", "ModelConfig"]


@dataclass
class ModelConfig:
    vocab_size: int = 256  # byte-level text; the procedural language has its own
    seq_len: int = 64  # context length, tokens
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 64
    qk_norm: bool = False  # norm on q and k: the standard fix for attention-logit growth
    pre_ln: bool = True  # False gives post-LN, which needs warmup to train at all
    init_scale: float = 1.0  # multiplies the 0.02 std of every weight init
    dropout: float = 0.0
    # the architecture of the ``drawn`` family (``drawn.py``); the other families are
    # built the one way each is, whatever these say
    block: str = "serial"  # or "parallel": attention and MLP side by side
    norm: str = "layernorm"  # or "rmsnorm"
    positions: str = "learned"  # or "rope", "alibi", "none"
    mlp: str = "gelu"  # or "swiglu"
    tied: bool = False  # the head shares the token embedding
    attention: str = "mha"  # or "gqa" (n_head // 2 key/value heads), "mqa" (one)

    @property
    def n_kv_head(self) -> int:
        """Key/value heads of ``attention``: all, half (at least one) or one."""
        return {"mha": self.n_head, "gqa": max(1, self.n_head // 2), "mqa": 1}[self.attention]

    def to_dict(self) -> dict:
        return asdict(self)


class Decoder(nn.Module):
    """Decoder-only language model; ``forward(idx, targets)`` returns ``(logits, loss)``.

    ``block(config)`` builds one block, which must have an ``attn`` whose
    ``out_projection`` writes into the residual stream. ``final_norm`` is the norm
    before the head (``None``: none, as in post-LN). ``tied`` shares the token
    embedding with the head (the head stays an ``nn.Linear``, registered last, so the
    probe finds the logits layer where it looks for it).
    """

    def __init__(
        self,
        config: ModelConfig,
        block: Callable[[ModelConfig], nn.Module],
        *,
        learned_positions: bool,
        final_norm: Callable[[int], nn.Module] | None,
        tied: bool = False,
    ):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        if learned_positions:
            self.pos_emb = nn.Embedding(config.seq_len, config.d_model)
        self.blocks = nn.ModuleList(block(config) for _ in range(config.n_layer))
        self.ln_f = final_norm(config.d_model) if final_norm else nn.Identity()
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self._init_weights(config.init_scale)
        if tied:
            self.head.weight = self.tok_emb.weight

    def _init_weights(self, scale: float) -> None:
        std = 0.02 * scale
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.MultiheadAttention):  # its qkv is a bare Parameter
                nn.init.normal_(module.in_proj_weight, mean=0.0, std=std)
                if module.in_proj_bias is not None:
                    nn.init.zeros_(module.in_proj_bias)
        # GPT-2's residual scaling keeps the residual stream's variance flat with depth
        for block in self.blocks:
            nn.init.normal_(
                block.attn.out_projection.weight, std=std / math.sqrt(2 * self.config.n_layer)
            )

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        seq = idx.shape[1]
        if seq > self.config.seq_len:
            raise ValueError(
                f"sequence has {seq} tokens, the model's context is {self.config.seq_len}; "
                "crop the batch or build the model with a larger seq_len"
            )
        x = self.tok_emb(idx)
        if hasattr(self, "pos_emb"):
            x = x + self.pos_emb(torch.arange(seq, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))
        return logits, loss
