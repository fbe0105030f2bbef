"""Finding the parts of a model the probe needs: its transformer blocks and its logits layer.

Blocks are the children of an ``nn.ModuleList`` whose attribute name is one of
:data:`BLOCK_LIST_NAMES` (nanoGPT ``blocks``, GPT-2 ``h``, Llama/OPT/``nn.TransformerEncoder``
``layers``, BERT ``layer``, T5 ``block``); when several match, the one holding the most
parameters wins (the decoder of a decoder-only model, the larger stack otherwise). Without
a name match, the largest ``ModuleList`` of at least two same-class modules is taken.
"""

from __future__ import annotations

from torch import nn

__all__ = ["BLOCK_LIST_NAMES", "find_blocks", "find_logits_module"]

BLOCK_LIST_NAMES: frozenset[str] = frozenset({"blocks", "h", "layers", "layer", "block"})


def _numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def find_blocks(model: nn.Module) -> tuple[nn.Module, ...]:
    """The model's transformer blocks, lowest (first applied) first; empty if none found."""
    named, uniform = [], []
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) == 0:
            continue
        if _numel(module) == 0:
            continue
        if name.rsplit(".", 1)[-1] in BLOCK_LIST_NAMES:
            named.append(module)
        elif len(module) >= 2 and len({type(m) for m in module}) == 1:
            uniform.append(module)
    candidates = named or uniform
    if not candidates:
        return ()
    return tuple(max(candidates, key=_numel))


def find_logits_module(model: nn.Module) -> nn.Module | None:
    """The last registered ``nn.Linear``: the output head in common layouts, or None."""
    last = None
    for module in model.modules():
        if isinstance(module, nn.Linear):
            last = module
    return last
