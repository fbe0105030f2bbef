"""Where the probe's hooks fire, the state they see, and the contract of a signal group.

The user's loop, with the probe's two calls::

    probe = Probe(model, optimizer)          # finds blocks, the logits layer; hooks the model
    for batch in loader:
        logits, loss = model(*batch)         # first call: the probe batch is captured here
        loss.backward()
        probe.after_backward(loss)           # <AFTER_BACKWARD> gradients (before clipping),
                                             #   sketch of the parameters before the step
        # (clip, unscale, set param_group["lr"]: the probe has already read the gradients)
        optimizer.step()                     # or scaler.step(optimizer); scaler.update()
        record = probe.after_step()          # <AFTER_STEP> update, loss, lr, AMP, and on
                                             #   their periods: probe-batch pass, system,
                                             #   sharpness; one host sync, then the record
        optimizer.zero_grad()
        scheduler.step()                     # after after_step, so `lr` is the step's own

A group is a small class: ``update(state) -> self`` measures, ``pending()`` returns
its values as they lie (device tensors, no sync), ``get()`` returns them as floats,
``reset()`` forgets all history. Groups observe; none may change the model, the
optimizer, the gradients or any random number generator.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from collapse_guard.probe.config import ProbeConfig

__all__ = ["Event", "ProbeState", "SignalGroup", "to_floats"]


class Event(enum.Enum):
    """The two points of the loop where the probe runs (see the module docstring)."""

    AFTER_BACKWARD = "after_backward"
    AFTER_STEP = "after_step"


@dataclass
class ProbeState:
    """Everything a group may read at one event; built by the probe, never kept by groups."""

    step: int  # index of the optimizer step being measured, from 0
    event: Event
    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss: torch.Tensor | None = None  # the loss handed to after_backward (unscaled)
    scaler: Any = None  # torch.amp.GradScaler, or None without AMP
    blocks: tuple[nn.Module, ...] = ()  # transformer blocks, lowest first (may be empty)
    bottom_block: nn.Module | None = None
    logit_max: torch.Tensor | None = None  # max |logit| of this step's training forwards
    probe_pass: Any = None  # capture.ProbePass of this step's probe-batch pass, if any
    loss_closure: Callable[[], torch.Tensor] | None = None  # for sharpness
    lr: float = math.nan  # first param group's lr, read after the step
    # False: no host read before after_step's record, even where one is free (the CPU):
    # the guard's deferred facts keep every value on the device until the next step
    host_reads: bool = True
    # the model's trainable parameters, listed once per event by the probe (a walk over
    # the modules costs ~0.3 ms on a small GPT; the groups share it)
    params: list | None = None
    # the parameters' sketch at this event, gathered once for every sketched group (they
    # share the coordinates: updates.SketchedGroup._param_sketch)
    sketches: dict = field(default_factory=dict)

    def trainable(self) -> list:
        """The trainable parameters (``params``, or the model's when none were given)."""
        if self.params is None:
            self.params = [p for p in self.model.parameters() if p.requires_grad]
        return self.params


class SignalGroup:
    """Base of every group: its keys, its period's config field, the events it uses."""

    keys: ClassVar[tuple[str, ...]] = ()
    period_field: ClassVar[str] = ""
    events: ClassVar[frozenset[Event]] = frozenset({Event.AFTER_STEP})
    # True: the probe runs update() with the model in eval mode and the RNG forked
    isolated: ClassVar[bool] = False
    # steps before each due step at which update() runs too, to read what the due step
    # compares against (consecutive gradients); their records hold NaN for the group
    lead: ClassVar[int] = 0

    def __init__(self, config: ProbeConfig | None = None) -> None:
        self.config = config or ProbeConfig()
        self._values: dict[str, torch.Tensor | float] = {}
        self.reset()  # a group's history starts where reset() leaves it

    def update(self, state: ProbeState) -> SignalGroup:
        raise NotImplementedError

    def pending(self) -> dict[str, torch.Tensor | float]:
        """Values of the last update, unsynced; NaN for keys it did not measure."""
        return {key: self._values.get(key, math.nan) for key in self.keys}

    def get(self) -> dict[str, float]:
        return to_floats(self.pending())

    def clear(self) -> None:
        """Forget the last values (history kept): the next get() is all NaN."""
        self._values = {}

    def reset(self) -> None:
        """Forget everything, as if just constructed (subclasses extend it, calling super)."""
        self._values = {}


def to_floats(values: Mapping[str, torch.Tensor | float]) -> dict[str, float]:
    """Convert values to Python floats with one host transfer per device.

    This is the probe's sync point: the 0-d tensors of every group are stacked and
    copied to the host together, instead of one ``.item()`` (one GPU sync) each. CPU
    tensors are read one by one: nothing to sync with, and the stack costs ~13 us a value
    against ~0.7 us for ``float`` (the same exact widening to float64).
    """
    out: dict[str, float] = {}
    by_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
    for key, value in values.items():
        if isinstance(value, torch.Tensor) and value.device.type != "cpu":
            by_device.setdefault(value.device, []).append((key, value))
        else:
            out[key] = float(value)
    for items in by_device.values():
        stacked = torch.stack([v.detach().reshape(()).double() for _, v in items])
        # sync point: one device-to-host copy for all of this device's values
        for (key, _), number in zip(items, stacked.tolist(), strict=True):
            out[key] = number
    return {key: out[key] for key in values}
