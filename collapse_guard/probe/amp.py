"""AMP group: the GradScaler's scale and whether it skipped the step.

=================  ==============================================================
key                meaning
=================  ==============================================================
``loss_scale``     the scale this step's backward ran with (NaN without an
                   enabled GradScaler)
``overflow``       1 when the scaler found inf/NaN gradients and skipped the step
                   (seen as a found-inf flag before ``scaler.update()``, or as a
                   scale lower than at ``after_backward`` after it), else 0;
                   0 without AMP
=================  ==============================================================

Everything is read from the scaler's device tensors (``_scale``, the per-optimizer
found-inf flags), so measuring costs no sync; ``get_scale()`` would call ``.item()``.
"""

from __future__ import annotations

import math

import torch

from collapse_guard.probe.state import Event, ProbeState, SignalGroup

__all__ = ["AmpGroup"]


def _scale_of(scaler: object) -> torch.Tensor | None:
    if scaler is None or not scaler.is_enabled():
        return None
    scale = getattr(scaler, "_scale", None)
    return None if scale is None else scale.detach().clone().float()


class AmpGroup(SignalGroup):
    keys = ("loss_scale", "overflow")
    period_field = "output_every"
    events = frozenset({Event.AFTER_BACKWARD, Event.AFTER_STEP})

    def reset(self) -> None:
        super().reset()
        self._before: tuple[int, torch.Tensor] | None = None

    def update(self, state: ProbeState) -> AmpGroup:
        scale = _scale_of(state.scaler)
        if scale is None:
            self._values = {"loss_scale": math.nan, "overflow": 0.0}
            return self
        if state.event is Event.AFTER_BACKWARD:
            self._before = (state.step, scale)
            return self
        before = self._before[1] if self._before and self._before[0] == state.step else scale
        self._before = None
        overflow = scale < before  # update() backed the scale off: it found inf
        per_optimizer = getattr(state.scaler, "_per_optimizer_states", {})
        found = per_optimizer.get(id(state.optimizer), {}).get("found_inf_per_device", {})
        for flag in found.values():  # present between step() and update()
            overflow = overflow | (flag.to(scale.device) > 0)
        self._values = {"loss_scale": before, "overflow": overflow.float()}
        return self
