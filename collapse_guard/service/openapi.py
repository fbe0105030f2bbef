"""Moved to :mod:`collapse_guard.service.server.openapi`; this path is kept for one release."""

from collapse_guard.service.server.openapi import (
    ERROR_RESPONSES,
    body_of,
)

__all__ = [
    "ERROR_RESPONSES",
    "body_of",
]
