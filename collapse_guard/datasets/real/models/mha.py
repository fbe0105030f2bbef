"""Family ``mha``: attention through ``nn.MultiheadAttention`` (learned positions, GELU MLP).

The layout of code written against PyTorch's own attention module: its fused q/k/v
projection is internal, so there is no qk-norm in this family (high LR is made safe
here by warmup and clipping only). Training calls it with ``need_weights=False`` and
``is_causal=True``, which runs ``F.scaled_dot_product_attention``.
"""

from __future__ import annotations

import torch
from torch import nn

from collapse_guard.datasets.real.models.decoder import Decoder, ModelConfig
from collapse_guard.datasets.real.models.layers import ResidualBlock, gelu_mlp

__all__ = ["MHADecoder"]


class CausalMHA(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.mha = nn.MultiheadAttention(
            config.d_model, config.n_head, dropout=config.dropout, batch_first=True
        )
        mask = torch.ones(config.seq_len, config.seq_len, dtype=torch.bool).triu(1)
        self.register_buffer("mask", mask, persistent=False)  # True = may not attend

    @property
    def out_projection(self) -> nn.Linear:
        return self.mha.out_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq = x.shape[1]
        # is_causal is only a hint to MHA; the mask must be given and is what it checks
        out, _ = self.mha(
            x, x, x, attn_mask=self.mask[:seq, :seq], need_weights=False, is_causal=True
        )
        return out


def _block(config: ModelConfig) -> ResidualBlock:
    return ResidualBlock(
        config.d_model,
        lambda: CausalMHA(config),
        lambda: gelu_mlp(config.d_model),
        pre_ln=config.pre_ln,
    )


class MHADecoder(Decoder):
    def __init__(self, config: ModelConfig):
        if config.qk_norm:
            raise ValueError(
                "the mha family has no qk-norm (nn.MultiheadAttention projects q and k "
                "inside), got qk_norm=True; set qk_norm=False or use the gpt family"
            )
        super().__init__(
            config,
            _block,
            learned_positions=True,
            final_norm=nn.LayerNorm if config.pre_ln else None,
        )
