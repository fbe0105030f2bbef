"""The probe: every stability signal of a PyTorch training loop, measured in place.

``Probe(model, optimizer)``, then ``probe.after_backward(loss)`` after the backward pass
and ``record = probe.after_step()`` after the optimizer step. Each signal family lives
in its own module (``gradients``, ``updates``, ``attention``, ``outputs``, ``amp``,
``system``, ``sharpness``), each with a table of its keys.
"""

from collapse_guard.probe.capture import AttentionCapture
from collapse_guard.probe.config import ProbeConfig
from collapse_guard.probe.probe import FAMILIES, Probe
from collapse_guard.probe.state import Event, ProbeState, SignalFamily

__all__ = [
    "FAMILIES",
    "AttentionCapture",
    "Event",
    "Probe",
    "ProbeConfig",
    "ProbeState",
    "SignalFamily",
]
