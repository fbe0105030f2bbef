"""Transformers' ``Trainer`` under the guard: one callback (extra ``hf``).

>>> from collapse_guard.integrations.huggingface import GuardCallback
>>> guard_callback = GuardCallback(checkpoint_dir="guard")        # Guard's keywords
>>> trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[guard_callback])
>>> trainer.train()                      # guard_callback.guard: the Guard of this run

How it sits in the Trainer's step (transformers 5; the Trainer builds the optimizer, so
the guard is made at ``on_train_begin``, when it exists)::

    forward            a hook on the model keeps the output's `loss`
    backward           a hook on that loss reads the factor the Trainer backpropagated
                       it with (1 / gradient accumulation steps, ...): the step's loss
                       is the sum of loss x factor over its micro-batches, the value
                       the Trainer logs
    (clipping)         off: max_grad_norm becomes the guard's clip, restored at the end
    optimizer.step()   guard.step(loss): measure, decide, clip, LR multiplier, the
                       optimizer's own step or a skip, rollback, run file
    scheduler.step()   the Trainer's, as ever (the guard's LR multiplier is undone)

The guard's numbers (``guard/risk``, ``guard/level``, ``guard/lr_scale``, the action
counts: collapse_guard/guard/trackers.py) join every log of the Trainer (``on_log``):
``trainer.state.log_history`` and the callbacks after this one. The Trainer runs its
``report_to`` reporters before any callback it is handed, so they do not see them; the
callback's own ``trackers`` do, at the same steps: the active MLflow run by default (the
one the Trainer's MLflow reporter started, or the user's), a ``SummaryWriter`` handed over.

The loss must come out of the model (``labels`` in the batch, the Trainer's default
``compute_loss``); a ``compute_loss_func`` or label smoothing computes it elsewhere and
the first step says so. fp16 works as in a plain loop: accelerate's ``GradScaler``
scales the backward, the guard unscales once (``max_grad_norm`` is off, so accelerate
does not), steps it and updates it; the tap divides the scale out of the loss.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

try:
    from transformers import TrainerCallback
except ImportError as error:  # the extra is optional; say which one
    raise ImportError(
        "collapse_guard.integrations.huggingface needs transformers and accelerate: "
        "pip install 'collapse-guard[hf]'"
    ) from error

from collapse_guard.guard import Guard
from collapse_guard.guard.trackers import Trackers, TrackerSpec, guard_metrics
from collapse_guard.integrations._owned_step import OwnedStep, callback_policy, policy_with_clip

__all__ = ["GuardCallback", "LossTap"]


class LossTap:
    """The loss of each optimizer step as the Trainer backpropagates it.

    A forward hook keeps the model output's scalar ``loss`` (training forwards only);
    a hook on that tensor sees, during backward, the factor the Trainer scaled it by,
    so ``loss x factor`` summed over the step's micro-batches is the step's loss.
    """

    def __init__(self, model: torch.nn.Module, scaler: Any = None) -> None:
        self._total: torch.Tensor | None = None
        self._scaler = scaler  # fp16: the backward ran on loss x its scale
        self._handle = model.register_forward_hook(self._forward)

    def _forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if not (module.training and torch.is_grad_enabled()):
            return
        if isinstance(output, Mapping):
            loss = output.get("loss")
        elif isinstance(output, (tuple, list)) and output:
            loss = output[0]  # what the Trainer takes as the loss of a tuple output
        else:
            loss = None
        if torch.is_tensor(loss) and loss.ndim == 0 and loss.requires_grad:
            value = loss.detach().float()
            loss.register_hook(lambda grad: self._add(value * grad.detach().float()))

    def _add(self, part: torch.Tensor) -> None:
        self._total = part if self._total is None else self._total + part

    def take(self) -> torch.Tensor | None:
        """The loss summed since the last call (None if no training forward ran)."""
        total, self._total = self._total, None
        scale = getattr(self._scaler, "_scale", None)  # a device tensor: no sync
        if total is not None and scale is not None:
            total = total / scale.float()  # a power of two: exact
        return total

    def remove(self) -> None:
        self._handle.remove()


class GuardCallback(TrainerCallback):
    """Runs a :class:`~collapse_guard.guard.Guard` in ``Trainer.train()``.

    Args:
        checkpoint_dir: the guard's folder (checkpoint ring, run file, forensics).
        trackers: where the guard's numbers also go at each log (:class:`Trackers`):
            None is the active MLflow run, if any; ``[]`` nowhere but the Trainer's logs.
        **guard_kwargs: any other keyword of :class:`~collapse_guard.guard.Guard`
            (``risk``, ``policy``, ``probe_config``, ``run_id``, ...).

    ``guard`` is the run's Guard from ``on_train_begin`` on (e.g. ``guard.force_next``
    for a drill; ``guard.summary()`` after training).
    """

    def __init__(
        self,
        checkpoint_dir: str | os.PathLike = "guard-checkpoints",
        trackers: TrackerSpec = None,
        **guard_kwargs: Any,
    ) -> None:
        if "scaler" in guard_kwargs:
            raise ValueError(
                "GuardCallback takes no scaler: with fp16=True the Trainer's own GradScaler "
                "is the guard's; drop the scaler argument"
            )
        self.checkpoint_dir = checkpoint_dir
        self.guard_kwargs = guard_kwargs
        self.trackers = Trackers(trackers, every=1)  # at every log: the Trainer's cadence
        self.guard: Guard | None = None
        self._step: OwnedStep | None = None
        self._tap: LossTap | None = None
        self._restore: tuple[Any, float] | None = None

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self._release()  # a second train() gets a guard of its own
        if model is None or optimizer is None:
            raise RuntimeError("GuardCallback: the Trainer gave no model or optimizer")
        kwargs = dict(self.guard_kwargs)
        scaler = getattr(optimizer, "scaler", None)  # accelerate's, with fp16=True
        if scaler is not None:
            kwargs["scaler"] = scaler
        config = policy_with_clip(callback_policy(kwargs), args.max_grad_norm, "max_grad_norm")
        self._restore = (args, args.max_grad_norm)
        args.max_grad_norm = 0.0  # the guard clips, after it has measured the raw norm
        inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper holds it
        # the callback logs at the framework's cadence (its own trackers): the guard does not
        self.guard = Guard(model, inner, self.checkpoint_dir, policy=config, trackers=[], **kwargs)
        self._tap = LossTap(model, scaler)
        self._step = OwnedStep(optimizer, self.guard, self._tap.take)

    def on_log(self, args, state, control, logs=None, **kwargs):
        """The guard's numbers into this log, the entry ``log_history`` just took of it,
        and the trackers."""
        if self.guard is None or logs is None:
            return
        values = guard_metrics(self.guard)
        last = state.log_history[-1] if state.log_history else {}
        if last.get("step") == state.global_step and logs.keys() <= last.keys():
            last.update(values)  # the Trainer copied the logs there just before this call
        logs.update(values)
        self.trackers.log(self.guard, state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        self._release()

    def _release(self) -> None:
        """Hooks off, the optimizer's step and max_grad_norm back, the run file closed."""
        if self._step is not None:
            self._step.remove()
            self._tap.remove()
            self._step = self._tap = None
        if self._restore is not None:
            args, bound = self._restore
            args.max_grad_norm = bound
            self._restore = None
        if self.guard is not None:
            self.guard.close()  # idempotent; self.guard stays readable
