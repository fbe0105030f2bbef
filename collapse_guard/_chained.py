"""Several optimizers stepped as one, for a ``Guard`` (or any loop) that takes one.

A shared leaf (it imports torch alone): the dataset generators build Muon with AdamW from
it, and users import it as ``collapse_guard.integrations.chained.ChainedOptimizer``.

Muon is used on the hidden matrices with AdamW on the rest (embeddings, head, norms,
biases): two torch optimizers. ``ChainedOptimizer(muon, adamw)`` steps, zeroes, saves and
restores them as one, and its ``param_groups`` are theirs, so an LR set there (the loop's
schedule, the guard's cap) reaches the optimizer that steps, after a ``load_state_dict``
too. torch's ``load_state_dict`` builds new group dicts inside each optimizer; a wrapper
that hands out the old ones loses them, and a rescue's rollback then leaves the LR at the
checkpoint's (``collapse_guard.guard.check.lr_reaches`` warns of it). The chain puts the
loaded values back into the dicts it hands out.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

__all__ = ["ChainedOptimizer", "closure_loss"]


class ChainedOptimizer(torch.optim.Optimizer):
    """``optimizers`` (disjoint parameters) stepped, zeroed, saved and restored as one;
    ``param_groups`` lists theirs in order, ``state`` reads theirs."""

    def __init__(self, *optimizers: torch.optim.Optimizer) -> None:
        if not optimizers or not all(isinstance(o, torch.optim.Optimizer) for o in optimizers):
            got = ", ".join(type(o).__name__ for o in optimizers) or "nothing"
            raise TypeError(
                f"ChainedOptimizer takes torch optimizers, got {got}; pass each one, "
                "e.g. ChainedOptimizer(torch.optim.Muon(matrices), torch.optim.AdamW(rest))"
            )
        self.optimizers = optimizers
        # the same dicts: torch's add_param_group keeps the dict it is given
        super().__init__([group for o in optimizers for group in o.param_groups], {})
        self.state = _UnionState(*(o.state for o in optimizers))
        self._built = True  # torch's __init__ adds the groups above through add_param_group

    def add_param_group(self, param_group: dict) -> None:
        if getattr(self, "_built", False):  # a group of the chain's own: no optimizer steps it
            raise TypeError(
                "ChainedOptimizer.add_param_group: the chain steps no group of its own, so "
                "these parameters would never train; add the group to one of the optimizers "
                "(optimizer.add_param_group(group)) and build the chain from them again"
            )
        super().add_param_group(param_group)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        for optimizer in self.optimizers:
            optimizer.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"optimizers": [optimizer.state_dict() for optimizer in self.optimizers]}

    def load_state_dict(self, state_dict: dict) -> None:
        saved = state_dict.get("optimizers") if isinstance(state_dict, Mapping) else None
        if not isinstance(saved, list | tuple) or len(saved) != len(self.optimizers):
            count = len(saved) if isinstance(saved, list | tuple) else "no"
            raise ValueError(
                f"ChainedOptimizer.load_state_dict: the state holds {count} optimizers' "
                f"states under 'optimizers', this chain {len(self.optimizers)}; load a state "
                "saved by a chain of the same optimizers, in the same order"
            )
        for optimizer, state in zip(self.optimizers, saved, strict=True):
            optimizer.load_state_dict(state)
        exposed = iter(self.param_groups)
        for optimizer in self.optimizers:
            for index, loaded in enumerate(optimizer.param_groups):
                group = next(exposed)
                group.update(loaded)
                optimizer.param_groups[index] = group


def closure_loss(closure) -> torch.Tensor | None:
    """``closure()`` with gradients on, as ``torch.optim`` optimizers call it; None without one."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class _UnionState(Mapping):
    """Read view of several optimizers' states (their parameters are disjoint); not a
    ChainMap, whose lookup would add an empty entry to the first one, a ``defaultdict``."""

    def __init__(self, *states: dict):
        self._states = states

    def __getitem__(self, param):
        for state in self._states:
            if param in state:
                return state[param]
        raise KeyError(param)

    def __iter__(self):
        return (param for state in self._states for param in state)

    def __len__(self) -> int:
        return sum(len(state) for state in self._states)
