"""Parameter snapshots for the integration tests (a module name no other test folder has)."""

from __future__ import annotations

import torch

__all__ = ["same", "snapshot"]


def snapshot(module: torch.nn.Module) -> list[torch.Tensor]:
    """Copies of the module's parameters, to compare across a step."""
    return [p.detach().clone() for p in module.parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
