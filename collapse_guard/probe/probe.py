"""The probe: measures every stability signal of a plain PyTorch training loop.

Example::

    probe = Probe(model, optimizer)
    for x, y in loader:
        logits, loss = model(x, y)
        loss.backward()
        probe.after_backward(loss)       # gradients, before any clipping
        optimizer.step()
        record = probe.after_step()      # {signal name: float}, NaN where not measured
        optimizer.zero_grad()

Where each call fires and what it reads: :mod:`collapse_guard.probe.state`. The
probe observes only: it never changes parameters, gradients, optimizer state, module
modes (they are restored) or the global RNG (forked around probe passes).
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _module

from collapse_guard.probe.amp import AmpGroup
from collapse_guard.probe.attention import AttentionGroup
from collapse_guard.probe.capture import (
    UNREACHED_NONE,
    BatchCapture,
    LogitsTap,
    ProbePass,
    isolated,
    normalize_batch,
    run_probe_pass,
)
from collapse_guard.probe.config import ProbeConfig
from collapse_guard.probe.gradients import GradientGroup
from collapse_guard.probe.layout import find_blocks, find_logits_module
from collapse_guard.probe.line_search import LineSearchGroup
from collapse_guard.probe.optimizer_state import OptimizerStateGroup
from collapse_guard.probe.outputs import OutputGroup, PredictionGroup
from collapse_guard.probe.recorder import open_writer
from collapse_guard.probe.sharpness import SharpnessGroup, loss_of
from collapse_guard.probe.state import Event, ProbeState, SignalGroup, to_floats
from collapse_guard.probe.system import SystemGroup
from collapse_guard.probe.updates import UpdateGroup
from collapse_guard.signals import SIGNAL_NAMES

__all__ = ["GROUPS", "Probe"]

# Parameters and submodules registered on any module since import: a probe walks its
# model's parameters again only when this moved (the walk costs ~90 us a step on a small
# GPT). Registration is every way a model gains or swaps one (attribute, add_module,
# register_parameter, load_state_dict(assign=True)); a bare `del module.attr` or a
# parameter set to None is not seen until the next registration anywhere.
_registrations = [0]


def _registered(*_: object) -> None:
    _registrations[0] += 1  # returns None: the value registered is left as it is


_module.register_module_parameter_registration_hook(_registered)
_module.register_module_module_registration_hook(_registered)

# Every group, in measuring order; together they cover SIGNAL_NAMES exactly.
GROUPS: tuple[type[SignalGroup], ...] = (
    GradientGroup,
    UpdateGroup,
    OptimizerStateGroup,
    OutputGroup,
    AmpGroup,
    AttentionGroup,
    PredictionGroup,
    SystemGroup,
    SharpnessGroup,
    LineSearchGroup,
)


class Probe:
    """Observe a training loop: ``after_backward(loss)``, then ``after_step() -> record``.

    Args:
        model: the module being trained.
        optimizer: its optimizer; ``lr`` is read from ``param_groups[0]``.
        config: a :class:`ProbeConfig` or a mapping of its fields.
        scaler: the AMP ``GradScaler``, if any (unscales gradient norms, gives
            ``loss_scale`` and ``overflow``).
        bottom_block: the lowest transformer block (module or dotted name); found
            automatically for common layouts (``collapse_guard.probe.layout``).
        logits_module: the layer whose output is the logits; default: last ``nn.Linear``.
        attention_fn: escape hatch for models whose attention the probe cannot reach:
            ``fn(model)`` returns attention probability tensors (..., heads, queries,
            keys) or ``AttentionCapture`` objects; called inside the probe sandbox.
        probe_batch: the fixed probe batch (a tensor, a tuple of args or a dict of
            kwargs for ``model``); default: the first training forward's inputs, cut to
            ``config.probe_batch_size`` sequences of at most ``config.probe_seq_len``.
        loss_closure: ``fn() -> scalar loss`` for the groups that evaluate the loss
            (sharpness, line); default: the probe batch through ``model``.
        sharpness_closure: the old name of ``loss_closure`` (deprecated: it feeds the
            line group too).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        config: ProbeConfig | Mapping[str, Any] | None = None,
        *,
        scaler: Any = None,
        bottom_block: nn.Module | str | None = None,
        logits_module: nn.Module | str | None = None,
        attention_fn: Callable[[nn.Module], Sequence[Any]] | None = None,
        probe_batch: Any = None,
        loss_closure: Callable[[], torch.Tensor] | None = None,
        sharpness_closure: Callable[[], torch.Tensor] | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(
                f"model must be a torch.nn.Module, got {type(model).__name__}; "
                "pass the module you call in the training loop"
            )
        if not hasattr(optimizer, "param_groups"):
            raise TypeError(
                f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}"
            )
        if config is None:
            config = ProbeConfig()
        elif isinstance(config, Mapping):
            config = ProbeConfig.from_dict(config)
        elif not isinstance(config, ProbeConfig):
            raise TypeError(
                f"config must be a ProbeConfig or a mapping, got {type(config).__name__}"
            )
        self.model, self.optimizer, self.config, self.scaler = model, optimizer, config, scaler
        self.attention_fn = attention_fn
        if sharpness_closure is not None:
            _warn_renamed()
            if loss_closure is not None:
                raise TypeError(
                    "Probe got both loss_closure and sharpness_closure (its old name); "
                    "pass loss_closure alone"
                )
        self.loss_closure = loss_closure if loss_closure is not None else sharpness_closure
        self.step = 0  # index of the optimizer step being measured, from 0
        self.blocks = find_blocks(model)
        self.bottom_block = self._module(bottom_block, "bottom_block") or (
            self.blocks[0] if self.blocks else None
        )
        head = self._module(logits_module, "logits_module") or find_logits_module(model)
        self._tap = LogitsTap(head) if head is not None else None
        self._batch: tuple[tuple, dict] | None = None
        self._capture: BatchCapture | None = None
        if probe_batch is not None:
            self._batch = normalize_batch(probe_batch)
        else:
            self._capture = BatchCapture(model, config.probe_batch_size, config.probe_seq_len)
        self.groups: tuple[SignalGroup, ...] = tuple(cls(config) for cls in GROUPS)
        self._loss: torch.Tensor | float | None = None
        self._writer: Any = None
        self._warned_attention = False
        self.last_pass: ProbePass | None = None  # this step's probe pass (the guard's QK-clip)
        # False: no host read before the record, not even a free one on the CPU (the
        # guard's deferred facts: every value stays on the device until after_step_pending)
        self.host_reads = True
        self._params: tuple[int, list] | None = None  # (step, trainable parameters)
        self._all: tuple[int, list] | None = None  # (registrations, every parameter)

    def _module(self, spec: nn.Module | str | None, what: str) -> nn.Module | None:
        if spec is None or isinstance(spec, nn.Module):
            return spec
        try:
            return self.model.get_submodule(spec)
        except AttributeError:
            names = [name for name, _ in self.model.named_modules() if name][:20]
            raise ValueError(
                f"{what}={spec!r} is not a submodule of the model; expected a dotted name "
                f"such as {names}"
            ) from None

    @property
    def probe_batch(self) -> tuple[tuple, dict] | None:
        """The probe batch as ``(args, kwargs)``, once known."""
        if self._batch is None and self._capture is not None:
            self._batch = self._capture.batch
        return self._batch

    def _due(self, group: SignalGroup) -> bool:
        """Whether ``group`` runs this step: a due step, or one of its ``lead`` steps."""
        period = getattr(self.config, group.period_field)
        return period > 0 and any((self.step + k) % period == 0 for k in range(group.lead + 1))

    def _state(self, event: Event, **fields: Any) -> ProbeState:
        return ProbeState(
            params=self._trainable(),
            step=self.step,
            event=event,
            model=self.model,
            optimizer=self.optimizer,
            loss=self._loss,
            scaler=self.scaler,
            blocks=self.blocks,
            bottom_block=self.bottom_block,
            host_reads=self.host_reads,
            **fields,
        )

    def _trainable(self) -> list:
        """The trainable parameters, listed once a step (``requires_grad`` read each step;
        the model's parameters walked again only after a registration: ``_registrations``)."""
        if self._params is None or self._params[0] != self.step:
            if self._all is None or self._all[0] != _registrations[0]:
                self._all = (_registrations[0], list(self.model.parameters()))
            self._params = (self.step, [p for p in self._all[1] if p.requires_grad])
        return self._params[1]

    @property
    def tensor_norms(self) -> torch.Tensor | None:
        """This step's gradient norm of every trainable tensor (0 without a gradient), on
        the device, once ``after_backward`` measured them; None when the gradient group
        is not due. The guard clips from these instead of a second pass."""
        group = self.groups[GROUPS.index(GradientGroup)]
        return group.tensor_norms if self._due(group) else None

    def after_backward(self, loss: torch.Tensor | float | None = None) -> None:
        """Call after ``loss.backward()`` (the last micro-batch's), before clipping/step."""
        self._loss = loss
        state = self._state(Event.AFTER_BACKWARD)
        for group in self.groups:
            if Event.AFTER_BACKWARD in group.events and self._due(group):
                group.update(state)

    @property
    def sharpness_closure(self) -> Callable[[], torch.Tensor] | None:
        """Deprecated name of :attr:`loss_closure`."""
        _warn_renamed()
        return self.loss_closure

    @sharpness_closure.setter
    def sharpness_closure(self, closure: Callable[[], torch.Tensor] | None) -> None:
        _warn_renamed()
        self.loss_closure = closure

    def _closure(self) -> Callable[[], torch.Tensor] | None:
        if self.loss_closure is not None:
            return self.loss_closure
        batch = self.probe_batch
        if batch is None:
            return None
        args, kwargs = batch
        return lambda: loss_of(self.model(*args, **kwargs))

    def after_step(self) -> dict[str, float]:
        """Call after ``optimizer.step()``; returns every signal (NaN = not measured)."""
        step = self.step
        record = dict.fromkeys(SIGNAL_NAMES, math.nan)
        record.update(to_floats(self.after_step_pending()))  # the step's one sync point
        if self._writer is not None:
            self._writer.append(step, record)
        return record

    def after_step_pending(self) -> dict[str, torch.Tensor | float]:
        """:meth:`after_step` without its sync: the step's values as they lie (device
        tensors, NaN floats), for a caller that reads them later (the guard, a step on).
        A probe recording with :meth:`record_to` records nothing from this call."""
        due = [group for group in self.groups if self._due(group)]
        lr = self.optimizer.param_groups[0]["lr"]
        # a tensor lr (capturable optimizers) costs a sync here; plain floats do not
        lr = float(lr)
        probe_pass = self.last_pass = None
        if any(isinstance(f, (AttentionGroup, PredictionGroup)) for f in due):
            probe_pass = run_probe_pass(self.model, self.probe_batch, self._tap, self.attention_fn)
            if probe_pass.unreached and any(isinstance(f, AttentionGroup) for f in due):
                self._warn_unreached(probe_pass.unreached)
            self.last_pass = probe_pass
        state = self._state(
            Event.AFTER_STEP,
            logit_max=self._tap.take() if self._tap else None,
            probe_pass=probe_pass or ProbePass([], None),
            loss_closure=self._closure(),
            lr=lr,
        )
        for group in due:
            if Event.AFTER_STEP not in group.events:
                continue
            if group.isolated:
                with isolated(self.model, grad=True), self._tap_off():
                    group.update(state)
            else:
                group.update(state)
        pending: dict[str, torch.Tensor | float] = {}
        for group in due:
            pending.update(group.pending())
        for group in self.groups:
            group.clear()
        self.step += 1
        self._loss = None
        return pending

    def _warn_unreached(self, why: str) -> None:
        """Once: the attention signals are NaN, and why. A model without a submodule named
        like an attention layer (``CausalSelfAttention``, ``LlamaAttention``, ``SelfAttn``)
        has no attention to miss (an MLP): no word then."""
        if self._warned_attention:
            return
        self._warned_attention = True
        names = (type(m).__name__.lower() for m in self.model.modules() if m is not self.model)
        if why == UNREACHED_NONE and not any(n.endswith(("attention", "attn")) for n in names):
            return
        names = ", ".join(AttentionGroup.keys)
        warnings.warn(
            f"collapse-guard probe: {names} are NaN: {why}. This warning is given once.",
            RuntimeWarning,
            stacklevel=3,
        )

    @contextlib.contextmanager
    def _tap_off(self) -> Iterator[None]:
        """Sharpness forwards are not training forwards: keep them out of output_logit_max."""
        if self._tap is None:
            yield
            return
        self._tap.mode = "off"
        try:
            yield
        finally:
            self._tap.mode = "train"

    def record_to(self, path: str | os.PathLike, meta: Any = None, chunk_steps: int = 256) -> Any:
        """Append every record to a run file; returns its ``RunWriter``."""
        if self._writer is not None:
            raise RuntimeError(
                f"the probe already records to {self._writer.path}; call probe.close() "
                "before recording to another file"
            )
        self._writer = open_writer(path, meta, chunk_steps)
        return self._writer

    def reset(self) -> None:
        """Forget all history (previous updates, attention); the step counter stays."""
        for group in self.groups:
            group.reset()

    def close(self) -> None:
        """Close the run file (if any) and remove the probe's hooks; safe to call twice."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None  # later steps are not recorded (until record_to again)
        if self._tap is not None:
            self._tap.remove()
            self._tap = None
        if self._capture is not None:
            self._batch = self.probe_batch
            self._capture.remove()
            self._capture = None


def _warn_renamed() -> None:
    warnings.warn(
        "collapse-guard: Probe's sharpness_closure is now loss_closure (it feeds the "
        "sharpness and line groups); the old name will go in a later release",
        DeprecationWarning,
        stacklevel=3,
    )
