"""Family ``drawn``: a decoder assembled from independently drawn parts.

Where the three hand-written families fix their parts together (rotary positions
always come with RMSNorm, SwiGLU and a tied head), this one takes each from the
config (``ModelConfig.block``, ``norm``, ``pre_ln``, ``positions``, ``mlp``, ``tied``,
``n_head``, ``attention``: how many key/value heads), so that a held-out evaluation
can leave out one part (every ALiBi run, every parallel block) rather than one family.
Attention always ends in ``F.scaled_dot_product_attention`` (``layers.SelfAttention``):
the probe sees it.
"""

from __future__ import annotations

from torch import nn

from collapse_guard.datasets.real.config import ARCHITECTURE_CHOICES
from collapse_guard.datasets.real.models.decoder import Decoder, ModelConfig
from collapse_guard.datasets.real.models.layers import (
    ALiBi,
    ResidualBlock,
    Rotary,
    SelfAttention,
    SwiGLU,
    gelu_mlp,
)

__all__ = ["Drawn"]

_NORMS = {"layernorm": nn.LayerNorm, "rmsnorm": nn.RMSNorm}


def _check(config: ModelConfig) -> None:
    for field, choices in ARCHITECTURE_CHOICES.items():
        if getattr(config, field) not in choices:
            raise ValueError(
                f"the drawn family has no {field}={getattr(config, field)!r}; "
                f"expected one of {', '.join(map(str, choices))}"
            )


def _attention(config: ModelConfig) -> SelfAttention:
    head_dim = config.d_model // config.n_head
    return SelfAttention(
        config.d_model,
        config.n_head,
        qk_norm=config.qk_norm,
        norm=_NORMS[config.norm],
        rotary=Rotary(head_dim, config.seq_len) if config.positions == "rope" else None,
        alibi=ALiBi(config.n_head, config.seq_len) if config.positions == "alibi" else None,
        dropout=config.dropout,
        n_kv_head=config.n_kv_head,
    )


def _block(config: ModelConfig) -> ResidualBlock:
    return ResidualBlock(
        config.d_model,
        lambda: _attention(config),
        (lambda: SwiGLU(config.d_model))
        if config.mlp == "swiglu"
        else (lambda: gelu_mlp(config.d_model)),
        norm=_NORMS[config.norm],
        pre_ln=config.pre_ln,
        parallel=config.block == "parallel",
    )


class Drawn(Decoder):
    """A decoder of the config's parts; post-LN has no final norm (as in ``gpt``)."""

    def __init__(self, config: ModelConfig):
        _check(config)
        super().__init__(
            config,
            _block,
            learned_positions=config.positions == "learned",
            final_norm=_NORMS[config.norm] if config.pre_ln else None,
            tied=config.tied,
        )
