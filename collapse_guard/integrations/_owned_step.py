"""What both integrations share: the guard owns the framework's ``optimizer.step``.

Transformers' Trainer and Lightning call ``optimizer.step()`` themselves, and their hooks
around that call can look but cannot stop the update. So the integrations replace
``step`` on that one optimizer object by an :class:`OwnedStep`: the framework's call runs
``guard.step(loss)``, which measures the raw gradients, decides, clips, sets the LR
multiplier, calls the optimizer's own ``step`` (or not: a skip), rolls back and records,
exactly as in a plain loop. The framework's own gradient clipping is switched off and its
bound handed to the guard (:func:`policy_with_clip`): clipping first would hide from the
guard the gradient norms it judges.

Batches a rescue asks to skip (``guard.batches`` in a plain loop) cannot be taken out of
a framework's data loader from a callback: their forward and backward run, and the update
is dropped, so the parameters see them no more than in a plain loop.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import torch

from collapse_guard.guard import Guard, GuardPolicy
from collapse_guard.guard.policy import policy_keyword

__all__ = ["OwnedStep", "callback_policy", "policy_with_clip"]


class OwnedStep:
    """``optimizer.step`` replaced by the guard's step until :meth:`remove`.

    Args:
        optimizer: the object the framework calls ``step`` on (it may wrap the one the
            guard steps, as accelerate's ``AcceleratedOptimizer`` does).
        guard: the guard that decides and steps.
        take_loss: returns the loss of the step (and forgets it), None if none was seen.
    """

    def __init__(
        self,
        optimizer: Any,
        guard: Guard,
        take_loss: Callable[[], torch.Tensor | None],
    ) -> None:
        self.optimizer, self.guard, self.take_loss = optimizer, guard, take_loss
        # a step set on the object itself (torch's LR schedulers wrap it to check the
        # order of the calls) is the optimizer's own step; kept, and put back after
        self._own = vars(optimizer).get("step")
        if hasattr(self._own, "_wrapped_by_lr_sched"):
            self._wrapped_by_lr_sched = True  # the scheduler's check: still wrapped
        optimizer.step = self  # an instance attribute hides the class's step

    def __call__(self, closure: Callable[[], Any] | None = None, **_: Any) -> Any:
        if hasattr(self, "_wrapped_by_lr_sched"):
            self.optimizer._opt_called = True  # what the scheduler's wrapper would note
        result = None
        if closure is not None:  # Lightning runs forward and backward inside step
            with torch.enable_grad():
                result = closure()
        loss = self.take_loss()
        if self.guard.should_skip_batch():
            return result  # a rescue asked to skip this batch: no update
        if loss is None:
            raise RuntimeError(
                "collapse-guard: no training loss was seen before this optimizer step; the "
                "guard needs it to decide (the transformers callback reads the model "
                "output's `loss`: pass `labels`; Lightning: the loss given to backward)"
            )
        self._put_back()  # the optimizer's own step, for the guard to call
        try:
            self.guard.step(loss)
        finally:
            self.optimizer.step = self
        return result

    def _put_back(self) -> None:
        if self._own is not None:
            self.optimizer.step = self._own
        else:
            del self.optimizer.step

    def remove(self) -> None:
        """Give the optimizer its own ``step`` back."""
        if vars(self.optimizer).get("step") is self:
            self._put_back()


def callback_policy(kwargs: dict[str, Any]) -> GuardPolicy | Mapping[str, Any] | None:
    """A callback's ``policy=`` (or ``config=``, its deprecated old name), taken out of the
    keywords it hands the ``Guard``."""
    return policy_keyword(
        kwargs.pop("policy", None), kwargs.pop("config", None), who="GuardCallback", stacklevel=5
    )


def policy_with_clip(
    config: GuardPolicy | Mapping[str, Any] | None, clip: float | None, setting: str
) -> GuardPolicy:
    """The guard's policy; its clip is the framework's bound (``setting``) unless ``config``
    sets one (a ``GuardPolicy``, or a mapping with ``clip``). The caller turns the
    framework's clipping off; a bound of 0 or None means it was off already."""
    if isinstance(config, GuardPolicy):
        policy, own = config, True
    else:
        values = dict(config or {})
        policy, own = GuardPolicy.from_dict(values), "clip" in values
    if not clip or clip <= 0:
        return policy
    if not own:
        return replace(policy, clip=float(clip))
    if float(clip) != policy.clip:
        warnings.warn(
            f"collapse-guard: {setting}={clip} is turned off; the guard clips gradients at "
            f"GuardPolicy.clip={policy.clip} (the config's)",
            UserWarning,
            stacklevel=3,
        )
    return policy
