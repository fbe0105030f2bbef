"""Family ``rope_swiglu``: a Llama-shaped decoder (rotary positions, RMSNorm, SwiGLU, tied head).

No position embedding (rotary positions act on q and k), no biases, pre-norm only;
``qk_norm`` puts an RMSNorm on q and k, as OLMo 2 and Gemma do.
"""

from __future__ import annotations

from torch import nn

from collapse_guard.datasets.real.models.decoder import Decoder, ModelConfig
from collapse_guard.datasets.real.models.layers import (
    ResidualBlock,
    Rotary,
    SelfAttention,
    SwiGLU,
)

__all__ = ["RopeSwiGLU"]


def _block(config: ModelConfig) -> ResidualBlock:
    return ResidualBlock(
        config.d_model,
        lambda: SelfAttention(
            config.d_model,
            config.n_head,
            qk_norm=config.qk_norm,
            norm=nn.RMSNorm,
            rotary=Rotary(config.d_model // config.n_head, config.seq_len),
            bias=False,
            dropout=config.dropout,
        ),
        lambda: SwiGLU(config.d_model),
        norm=nn.RMSNorm,
    )


class RopeSwiGLU(Decoder):
    def __init__(self, config: ModelConfig):
        if not config.pre_ln:
            raise ValueError(
                "the rope_swiglu family is pre-norm only, got pre_ln=False; "
                "use the gpt or mha family for post-LN runs"
            )
        super().__init__(config, _block, learned_positions=False, final_norm=nn.RMSNorm, tied=True)
