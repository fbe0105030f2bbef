"""Moved to :mod:`collapse_guard.service.middleware.memory`; this path is kept for one release."""

from collapse_guard.service.middleware.memory import (
    MMAP_BYTES,
    TRIM_BYTES,
    keep_freed_memory,
)

__all__ = [
    "MMAP_BYTES",
    "TRIM_BYTES",
    "keep_freed_memory",
]
