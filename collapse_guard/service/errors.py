"""Moved to :mod:`collapse_guard.service.middleware.bad_request`;
this path is kept for one release."""

from collapse_guard.service.middleware.bad_request import (
    BadRequest,
    field_path,
    from_validation,
)

__all__ = [
    "BadRequest",
    "field_path",
    "from_validation",
]
