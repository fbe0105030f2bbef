"""Moved to :mod:`collapse_guard.service.server.scoring`; this path is kept for one release."""

from collapse_guard.service.server.scoring import (
    ServedModel,
    answers_json,
    signal_of,
)

__all__ = [
    "ServedModel",
    "answers_json",
    "signal_of",
]
