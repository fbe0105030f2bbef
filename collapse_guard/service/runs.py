"""Moved: :class:`RawRun` to :mod:`collapse_guard.service.client.raw_run`, the windows to
:mod:`collapse_guard.service.server.windows`, their checks to
:mod:`~collapse_guard.service.server.window_checks` and the collapse now to
:mod:`~collapse_guard.service.server.collapse_now`; this path is kept for one release."""

from collapse_guard.service.client.raw_run import RawRun
from collapse_guard.service.server.collapse_now import nonfinite_reason, reasons_of
from collapse_guard.service.server.window_checks import (
    MAX_STEP,
    check_batch_size,
    check_window,
    from_json_run,
    steps_in_range,
)
from collapse_guard.service.server.windows import RunWindow, WindowBatch

__all__ = [
    "MAX_STEP",
    "RawRun",
    "RunWindow",
    "WindowBatch",
    "check_batch_size",
    "check_window",
    "from_json_run",
    "nonfinite_reason",
    "reasons_of",
    "steps_in_range",
]
