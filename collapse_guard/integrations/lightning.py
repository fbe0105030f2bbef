"""Lightning's ``Trainer`` under the guard: one callback (extra ``lightning``).

>>> from collapse_guard.integrations.lightning import GuardCallback
>>> guard_callback = GuardCallback(checkpoint_dir="guard")        # Guard's keywords
>>> trainer = L.Trainer(max_steps=1000, callbacks=[guard_callback])
>>> trainer.fit(module, loader)          # guard_callback.guard: the Guard of this fit

How it sits in Lightning's step (2.x; the optimizer exists from ``on_fit_start``)::

    optimizer.step(closure)   Lightning's call, now the guard's:
      closure()               training_step, backward (on_before_backward gives the
                              loss: summed over accumulated batches, each already
                              divided by accumulate_grad_batches), on_before_optimizer_step
      (clipping)              off: gradient_clip_val becomes the guard's clip
      guard.step(loss)        measure, decide, clip, LR multiplier, the optimizer's own
                              step or a skip, rollback, run file

The guard's numbers (``guard/risk``, ``guard/level``, ``guard/lr_scale``, the action
counts: collapse_guard/guard/trackers.py) are logged with ``pl_module.log_dict`` after
every batch, so every logger (CSV, MLflow, TensorBoard, ...) writes them at its
``log_every_n_steps``; the callback's own ``trackers`` get them at the same cadence (the
active MLflow run by default, a ``SummaryWriter`` handed over).

Automatic and manual optimization both end in that call. One optimizer per module.
``precision="16-mixed"`` works as in a plain loop: Lightning scales the backward and
unscales once (before its clipping hook); its ``scaler.step`` then calls the optimizer's
step, which is the guard's, and the guard steps and updates the real scaler
(:class:`GuardedScaler` is what Lightning holds meanwhile). The loss handed to the hook
is the scaled one: the scale is divided out.
"""

from __future__ import annotations

import os
from typing import Any

import torch

try:
    from lightning.pytorch import Callback
except ImportError as error:  # the extra is optional; say which one
    raise ImportError(
        "collapse_guard.integrations.lightning needs Lightning: "
        "pip install 'collapse-guard[lightning]'"
    ) from error

from collapse_guard.guard import Guard
from collapse_guard.guard.trackers import Trackers, TrackerSpec, guard_metrics
from collapse_guard.integrations._owned_step import OwnedStep, callback_policy, policy_with_clip

__all__ = ["GuardCallback", "GuardedScaler"]


class GuardedScaler:
    """Lightning's ``GradScaler`` while the guard steps: ``scale`` and ``unscale_`` (and
    everything else) are the real scaler's; ``step`` calls the optimizer's step, which is
    the guard's, which steps and updates the real scaler; ``update`` is then done."""

    def __init__(self, scaler: Any) -> None:
        self.scaler = scaler

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale: Any = None) -> None:
        """Done already: the guard updated the real scaler after its step."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.scaler, name)


class GuardCallback(Callback):
    """Runs a :class:`~collapse_guard.guard.Guard` in ``Trainer.fit()``.

    Args:
        checkpoint_dir: the guard's folder (checkpoint ring, run file, forensics).
        trackers: where the guard's numbers also go (:class:`Trackers`), every
            ``log_every_n_steps``: None is the active MLflow run, if any; ``[]`` nowhere
            but Lightning's loggers.
        **guard_kwargs: any other keyword of :class:`~collapse_guard.guard.Guard`
            (``risk``, ``policy``, ``probe_config``, ``run_id``, ...).

    ``guard`` is the fit's Guard from ``on_fit_start`` on.
    """

    def __init__(
        self,
        checkpoint_dir: str | os.PathLike = "guard-checkpoints",
        trackers: TrackerSpec = None,
        **guard_kwargs: Any,
    ) -> None:
        if "scaler" in guard_kwargs:
            raise ValueError(
                "GuardCallback takes no scaler: with precision='16-mixed' Lightning's own "
                "GradScaler is the guard's; drop the scaler argument"
            )
        self.checkpoint_dir = checkpoint_dir
        self.guard_kwargs = guard_kwargs
        self.trackers = Trackers(trackers)  # checked here; its cadence set at fit start
        self.guard: Guard | None = None
        self._step: OwnedStep | None = None
        self._loss: torch.Tensor | None = None
        self._plugin: Any = None  # the precision plugin whose scaler is a GuardedScaler
        self._scaler: Any = None

    def on_fit_start(self, trainer, pl_module) -> None:
        self._release()  # a second fit() gets a guard of its own
        if len(trainer.optimizers) != 1:
            raise ValueError(
                f"GuardCallback guards one optimizer; configure_optimizers gave "
                f"{len(trainer.optimizers)}"
            )
        bound = trainer.gradient_clip_val
        if bound and trainer.gradient_clip_algorithm not in (None, "norm"):  # None: norm
            raise ValueError(
                f"the guard clips by global norm; got gradient_clip_algorithm="
                f"{trainer.gradient_clip_algorithm!r}: set gradient_clip_val=None and "
                "GuardCallback(policy={'clip': ...})"
            )
        kwargs = dict(self.guard_kwargs)
        plugin = trainer.precision_plugin
        self._scaler = getattr(plugin, "scaler", None)  # 16-mixed's GradScaler
        if self._scaler is not None:
            kwargs["scaler"], self._plugin = self._scaler, plugin
            plugin.scaler = GuardedScaler(self._scaler)
        config = policy_with_clip(callback_policy(kwargs), bound, "gradient_clip_val")
        trainer.gradient_clip_val = None  # the guard clips, after it measured the raw norm
        optimizer = trainer.optimizers[0]
        # the callback logs at the framework's cadence (its own trackers): the guard does not
        self.guard = Guard(
            pl_module, optimizer, self.checkpoint_dir, policy=config, trackers=[], **kwargs
        )
        self._step = OwnedStep(optimizer, self.guard, self._take_loss)
        self.trackers.every = max(1, trainer.log_every_n_steps)  # the loggers' cadence

    def on_before_backward(self, trainer, pl_module, loss: torch.Tensor) -> None:
        part = loss.detach().float()
        scale = getattr(self._scaler, "_scale", None)  # 16-mixed: the loss came scaled
        if scale is not None:
            part = part / scale.float()  # a power of two: exact, and no sync
        self._loss = part if self._loss is None else self._loss + part

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        """The guard's numbers to Lightning's loggers and to the trackers."""
        if self.guard is not None:
            pl_module.log_dict(guard_metrics(self.guard), on_step=True, on_epoch=False)
            self.trackers.log(self.guard, trainer.global_step)

    def _take_loss(self) -> torch.Tensor | None:
        loss, self._loss = self._loss, None
        return loss

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if stage == "fit":
            self._release()

    def _release(self) -> None:
        """The optimizer's step back, the run file closed (``guard`` stays readable)."""
        if self._step is not None:
            self._step.remove()
            self._step = None
        if self._plugin is not None:
            self._plugin.scaler = self._scaler
            self._plugin = None
        if self.guard is not None:
            self.guard.close()
