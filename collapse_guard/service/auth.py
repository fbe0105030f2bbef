"""Moved to :mod:`collapse_guard.service.middleware.auth`; this path is kept for one release."""

from collapse_guard.service.middleware.auth import (
    OPEN_PATHS,
    TOKEN_ENV,
    BearerAuth,
)

__all__ = [
    "OPEN_PATHS",
    "TOKEN_ENV",
    "BearerAuth",
]
