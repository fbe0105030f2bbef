"""Family ``gpt``: nanoGPT's decoder (learned positions, LayerNorm, GELU MLP, separate head).

The knobs are the ones the literature ties to small-scale instabilities: qk-layernorm
(Wortsman et al. 2023, Dehghani et al. 2023), pre-LN vs post-LN (Xiong et al. 2020),
init scale.
"""

from __future__ import annotations

from torch import nn

from collapse_guard.datasets.real.models.decoder import Decoder, ModelConfig
from collapse_guard.datasets.real.models.layers import ResidualBlock, SelfAttention, gelu_mlp

__all__ = ["GPT", "GPTConfig"]

GPTConfig = ModelConfig  # the name the probe's examples and the README use


def _block(config: ModelConfig) -> ResidualBlock:
    return ResidualBlock(
        config.d_model,
        lambda: SelfAttention(
            config.d_model, config.n_head, qk_norm=config.qk_norm, dropout=config.dropout
        ),
        lambda: gelu_mlp(config.d_model),
        pre_ln=config.pre_ln,
    )


class GPT(Decoder):
    """nanoGPT-shaped decoder; post-LN (``pre_ln=False``) has no final norm."""

    def __init__(self, config: ModelConfig):
        super().__init__(
            config,
            _block,
            learned_positions=True,
            final_norm=nn.LayerNorm if config.pre_ln else None,
        )
