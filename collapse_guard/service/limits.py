"""Moved to :mod:`collapse_guard.service.middleware.limits`; this path is kept for one release."""

from collapse_guard.service.middleware.limits import (
    Limits,
)

__all__ = [
    "Limits",
]
