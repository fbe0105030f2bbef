"""Moved to :mod:`collapse_guard.service.server.json_reader`; this path is kept for one release."""

from collapse_guard.service.server.json_reader import (
    read_plain_json,
)

__all__ = [
    "read_plain_json",
]
