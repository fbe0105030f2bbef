"""The probe: every stability signal of a PyTorch training loop, measured in place.

``Probe(model, optimizer)``, then ``probe.after_backward(loss)`` after the backward pass
and ``record = probe.after_step()`` after the optimizer step. Each signal group lives
in its own module (``gradients``, ``updates``, ``optimizer_state``, ``attention``,
``outputs``, ``amp``, ``system``, ``sharpness``, ``line_search``), each with a table of
its keys.
"""

from collapse_guard.probe.capture import AttentionCapture
from collapse_guard.probe.config import ProbeConfig
from collapse_guard.probe.probe import GROUPS, Probe
from collapse_guard.probe.state import Event, ProbeState, SignalGroup

__all__ = [
    "GROUPS",
    "AttentionCapture",
    "Event",
    "Probe",
    "ProbeConfig",
    "ProbeState",
    "SignalGroup",
]

# "family" names a model family only; the old names of the signal groups work for one release
_RENAMED = {"FAMILIES": "GROUPS", "SignalFamily": "SignalGroup"}


def __getattr__(name: str):
    if name in _RENAMED:
        import warnings

        new = _RENAMED[name]
        warnings.warn(
            f"collapse_guard.probe.{name} is now {new} (signal groups); the old name goes in "
            "the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return globals()[new]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
