"""Moved to :mod:`collapse_guard.service.middleware.body_limit`;
this path is kept for one release."""

from collapse_guard.service.middleware.body_limit import (
    BodyLimit,
)

__all__ = [
    "BodyLimit",
]
