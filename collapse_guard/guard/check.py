"""<CHECK>: what ``guard.step`` is given is one number and this step's gradients.

:func:`scalar_loss` reads the loss or says why it cannot; :class:`GradientMarks` tells
whether the gradients are this step's (a fresh backward); :class:`OnceWarnings` gives
each of the guard's once-only warnings once; :func:`check_pair` tells a model and an
optimizer that do not belong together; :func:`lr_reaches` tells an optimizer whose
``param_groups`` no longer set the LR it steps with.
"""

from __future__ import annotations

import numbers
import warnings
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

__all__ = [
    "GradientMarks",
    "OnceWarnings",
    "check_pair",
    "lr_reaches",
    "lr_unreached_text",
    "scalar_loss",
    "stale_text",
]

_STALE = {
    "no_gradients": "every parameter's .grad is None: loss.backward() was not called",
    "same_gradients": "the gradients are those of the last guard.step (no backward() "
    "since): guard.step was called twice for one backward",
    "zero_gradients": "every gradient is exactly zero: zero_grad() ran but no "
    "backward() after it, or the loss does not depend on the model's parameters",
}


def scalar_loss(loss: Any) -> torch.Tensor:
    """The loss as a 0-d float tensor, or a clear error: the guard reads one number."""
    if torch.is_tensor(loss):
        if loss.numel() != 1:
            raise ValueError(
                f"guard.step(loss): the loss must be a scalar tensor (one number), got a "
                f"tensor of shape {tuple(loss.shape)}; reduce it first, e.g. "
                "guard.step(loss.mean()) (and call backward() on that same scalar)"
            )
        return loss.detach().float().reshape(())
    if isinstance(loss, numbers.Real) and not isinstance(loss, bool):
        return torch.tensor(float(loss))
    raise TypeError(
        f"guard.step(loss): the loss must be a scalar tensor (or a number), got "
        f"{type(loss).__name__} {loss!r:.60}; pass the tensor you called backward() on"
    )


class GradientMarks:
    """Which gradient tensors, at which versions, the last step saw."""

    def __init__(self) -> None:
        self._marks: list[tuple[Any, int]] | None = None  # (weakref, version) per grad

    def mark(self, params: Sequence[torch.Tensor]) -> None:
        self._marks = [
            (weakref.ref(p.grad), p.grad._version) if p.grad is not None else (None, 0)
            for p in params
        ]

    def stale(self, params: Sequence[torch.Tensor]) -> str:
        """Why the gradients cannot be this step's ("" when they are fresh): none at all,
        or the very tensors of the last step, unchanged (``guard.step`` twice per backward)."""
        grads = [p.grad for p in params]
        if all(g is None for g in grads):
            return "no_gradients"
        marks = self._marks
        if marks is None or len(marks) != len(grads):
            return ""
        for grad, (ref, version) in zip(grads, marks, strict=True):
            if grad is None:
                if ref is not None:
                    return ""
            elif ref is None or ref() is not grad or grad._version != version:
                return ""
        return "same_gradients"


def stale_text(why: str, step: int) -> str:
    """The warning of stale gradients (``why``: a :meth:`GradientMarks.stale` reason)."""
    return (
        f"collapse-guard: step {step}: {_STALE[why]}. The update is skipped (event "
        f"skip:{why}); call loss.backward() once, then guard.step(loss) once, per batch. "
        "This warning is given once."
    )


class OnceWarnings:
    """Warnings given once a run, by key, and only by rank 0 (the others repeat it)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._given: set[str] = set()

    def warn(self, key: str, message: str, stacklevel: int) -> None:
        if key in self._given or self.rank != 0:
            return
        self._given.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=stacklevel + 1)


def check_pair(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """The optimizer must update this model's parameters: the guard measures, clips and
    rolls back the model's, and an optimizer of another model would train unguarded."""
    mine = {id(p) for p in model.parameters()}
    if not mine:
        raise ValueError(
            f"Guard: the model ({type(model).__name__}) has no parameters, so there is "
            "nothing to guard; pass the module whose parameters the optimizer updates"
        )
    theirs = [p for group in optimizer.param_groups for p in group["params"]]
    if theirs and not any(id(p) in mine for p in theirs):
        raise ValueError(
            f"Guard: none of the optimizer's {len(theirs)} parameters belong to the model "
            f"({type(model).__name__}, {len(mine)} parameter tensors): the optimizer was "
            "built for another model; build it from this one, e.g. "
            "AdamW(model.parameters())"
        )
    outside = sum(id(p) not in mine for p in theirs)
    if outside:
        warnings.warn(
            f"collapse-guard: {outside} of the optimizer's {len(theirs)} parameters are not "
            "the model's: the guard neither measures nor rolls them back",
            UserWarning,
            stacklevel=4,  # the loop's Guard(...) call (through build_setup)
        )


def lr_reaches(optimizer: Any) -> bool:
    """Whether an LR set on ``optimizer.param_groups`` is the one its ``state_dict`` holds,
    a wrapper's nested optimizers included. False for a wrapper that hands out its inner
    optimizers' group dicts: torch's ``load_state_dict`` builds new ones inside, so after a
    rollback the guard's cap (and the loop's schedule) would reach nothing. True where it
    cannot tell: no groups in the state, or a state that cannot be read now."""
    groups = optimizer.param_groups
    kept = [group["lr"] for group in groups]
    marks = [-1.0 - index for index in range(len(groups))]  # no real LR is negative
    try:
        for group, mark in zip(groups, marks, strict=True):
            group["lr"] = mark
        held = _group_lrs(optimizer.state_dict())
    except Exception:  # advisory only: e.g. ZeRO's state_dict before its consolidation
        return True
    finally:
        for group, lr in zip(groups, kept, strict=True):
            group["lr"] = lr
    return not held or all(mark in held for mark in marks)


def _group_lrs(state: Any) -> list[Any]:
    """The ``lr`` of every group of every ``param_groups`` list in a (nested) state dict:
    a wrapper's may hold its optimizers' under keys or in a list."""
    if isinstance(state, list | tuple):
        return [lr for part in state for lr in _group_lrs(part)]
    if not isinstance(state, Mapping):
        return []
    groups = state.get("param_groups")
    groups = groups if isinstance(groups, list) else []
    found = [group.get("lr") for group in groups if isinstance(group, Mapping)]
    for key, value in state.items():
        if key not in ("param_groups", "state"):  # "state": per-parameter tensors
            found += _group_lrs(value)
    return found


def lr_unreached_text(step: int, optimizer: Any) -> str:
    """The warning of an optimizer whose LR a rollback cut off (:func:`lr_reaches`)."""
    return (
        f"collapse-guard: step {step}: after the rollback restored "
        f"{type(optimizer).__name__}, an LR set on its param_groups no longer reaches the "
        "optimizer it steps with (its state_dict holds other groups): the guard's LR cap "
        "and your schedule will not apply. A wrapper of several optimizers must keep the "
        "dicts it exposes as param_groups through load_state_dict (docs/guard.md). "
        "This warning is given once."
    )
