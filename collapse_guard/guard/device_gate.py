"""The reactive skip decided on the device, and a step's facts read by the host a step later.

A guarded step needs its own loss and gradient norm before the update: is either
non-finite, an outlier, or a loss that confirms a collapse? Read on the host, that is a
sync a step, which stalls a GPU's queue (OLMo-core's skip-step optimizer avoids it with
a ``step_factor`` tensor). Here the same rules are evaluated on the device, in float64
with the host's own thresholds, so the verdict is the one the host would reach, bit for
bit (:func:`skip_flag`); an optimizer that takes a ``found_inf`` tensor (torch's fused
Adam, AdamW, SGD: ``_step_supports_amp_scaling``) then skips on the device, its step
count included (:func:`gated_step`). The step's facts travel to the host without
blocking (:class:`HostCopy`: a non-blocking copy into pinned memory and a CUDA event)
and are read at the next step, as a risk answer already is.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["GateBands", "HostCopy", "can_skip_on_device", "gated_step", "skip_flag"]


@dataclass(frozen=True)
class GateBands:
    """The host's thresholds of one step, as plain floats (NaN / inf: the rule is off)."""

    loss_band: tuple[float, float] | None  # (mean, std) of the loss history, None: too short
    grad_band: tuple[float, float] | None
    z: float  # outlier z of the level; math.inf when outliers are being accepted
    smoothed: float  # the online label's smoothed loss before this step (NaN: none yet)
    alpha: float  # its EWMA weight
    collapse_line: float  # a smoothed loss above this confirms a collapse (inf: never)


def can_skip_on_device(optimizer: Any) -> bool:
    """True when ``optimizer.step()`` reads a ``found_inf`` tensor and skips on the device."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def _over(value: torch.Tensor, band: tuple[float, float] | None, z: float) -> torch.Tensor:
    if band is None or not math.isfinite(z):
        return torch.zeros((), dtype=torch.bool, device=value.device)
    mean, std = band
    return (value - mean) / std > z  # the host's OutlierHistory.z, in the same float64 ops


def skip_flag(loss: torch.Tensor, total: torch.Tensor, bands: GateBands) -> torch.Tensor:
    """0-d bool on the device: the exact decision would not apply this update.

    Its reasons, in ``decision.decide``'s terms: a non-finite loss (rescue), a
    non-finite or all-zero gradient (skip), a loss or gradient-norm z-score over ``z``
    (skip), a smoothed loss over the online label's line (rescue: online collapse).
    """
    loss64, total64 = loss.to(total.device).double(), total.double()
    bad = ~torch.isfinite(loss64) | ~torch.isfinite(total64) | (total64 == 0)
    bad = bad | _over(loss64, bands.loss_band, bands.z) | _over(total64, bands.grad_band, bands.z)
    if math.isfinite(bands.collapse_line):
        # OnlineLabel.update's EWMA, op for op (separate kernels: no fused multiply-add)
        smoothed = (
            loss64
            if math.isnan(bands.smoothed)
            else (loss64 - bands.smoothed) * bands.alpha + bands.smoothed
        )
        bad = bad | (smoothed > bands.collapse_line)
    elif bands.collapse_line < 0:  # any finite loss confirms the collapse
        bad = torch.ones_like(bad)
    return bad


def gated_step(optimizer: Any, skip: torch.Tensor) -> None:
    """``optimizer.step()`` that the device turns into a no-op where ``skip`` is set."""
    optimizer.grad_scale, optimizer.found_inf = None, skip.float()
    try:
        optimizer.step()
    finally:  # as GradScaler does: a later plain step must not see this flag
        del optimizer.grad_scale, optimizer.found_inf


class HostCopy:
    """Named values (tensors of any shape, or floats) on their way to the host; :meth:`read`
    them a step later. On a GPU: one flat copy per device, non-blocking into pinned memory,
    and an event, so neither this step nor the read stalls the queue (the event is long
    past by then). CPU tensors are host memory already."""

    def __init__(self, values: dict[Hashable, torch.Tensor | float]) -> None:
        self.keys = list(values)
        self.floats = {k: float(v) for k, v in values.items() if not torch.is_tensor(v)}
        by_device: dict[torch.device, list[tuple[Hashable, torch.Tensor]]] = {}
        for key, value in values.items():
            if torch.is_tensor(value):
                by_device.setdefault(value.device, []).append((key, value))
        self.parts: list[tuple[list[tuple[Hashable, torch.Size]], torch.Tensor, Any]] = []
        for device, items in by_device.items():
            flat = torch.cat([v.detach().reshape(-1).double() for _, v in items])
            event = None
            if device.type == "cuda":
                host = torch.empty(len(flat), dtype=torch.float64, pin_memory=True)
                host.copy_(flat, non_blocking=True)
                event = torch.cuda.Event()
                event.record()
                flat = host
            self.parts.append(([(k, v.shape) for k, v in items], flat, event))

    def read(self) -> dict[Hashable, float | np.ndarray]:
        """The values in their order: a float for a 0-d tensor or a float, a float64 array
        of its shape otherwise (host memory: ``numpy``, no device read)."""
        out: dict[Hashable, float | np.ndarray] = dict(self.floats)
        for shapes, host, event in self.parts:
            if event is not None:
                event.synchronize()  # recorded a step ago: already passed
            flat, at = host.numpy(), 0
            for key, shape in shapes:
                part, at = flat[at : at + shape.numel()], at + shape.numel()
                out[key] = float(part[0]) if not shape else part.reshape(shape)
        return {k: out[k] for k in self.keys}
