"""Model families of the real runs, one small module each; built by name.

=================  ==============================================================
family             what it is
=================  ==============================================================
``gpt``            nanoGPT: learned positions, LayerNorm (pre or post), GELU MLP,
                   separate head, optional qk-layernorm (``gpt.py``)
``rope_swiglu``    Llama-shaped: rotary positions, RMSNorm, SwiGLU MLP, tied
                   embeddings, optional qk-RMSNorm (``rope_swiglu.py``)
``mha``            attention through ``nn.MultiheadAttention``, learned positions,
                   GELU MLP, no qk-norm possible (``mha.py``)
``drawn``          each part from the config: serial or parallel block, LayerNorm or
                   RMSNorm, pre or post, learned / rotary / ALiBi / no positions,
                   GELU or SwiGLU, tied or separate head (``drawn.py``)
=================  ==============================================================

All share ``decoder.Decoder`` (embeddings, init, head, loss) and ``layers`` (the
attention, MLPs and residual block); each module only says how its block is built.
Importing this package imports torch: the sampler and config never do.
"""

from __future__ import annotations

import importlib

from torch import nn

from collapse_guard.datasets.real.models.decoder import Decoder, ModelConfig

__all__ = ["FAMILY_CLASSES", "Decoder", "ModelConfig", "build_model"]

# family name -> (module, class): imported on first use
FAMILY_CLASSES: dict[str, tuple[str, str]] = {
    "gpt": ("gpt", "GPT"),
    "rope_swiglu": ("rope_swiglu", "RopeSwiGLU"),
    "mha": ("mha", "MHADecoder"),
    "drawn": ("drawn", "Drawn"),
}


def build_model(family: str, config: ModelConfig) -> nn.Module:
    """A freshly initialised model of ``family`` (seed torch first for a repeatable init)."""
    if family not in FAMILY_CLASSES:
        raise ValueError(
            f"family={family!r} is not known; expected one of {', '.join(FAMILY_CLASSES)}"
        )
    module, name = FAMILY_CLASSES[family]
    cls = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    return cls(config)
