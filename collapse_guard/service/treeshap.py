"""Moved to :mod:`collapse_guard.service.server.treeshap`; this path is kept for one release."""

from collapse_guard.service.server.treeshap import (
    MAX_PATH_FEATURES,
    LeafTables,
    build,
)

__all__ = [
    "MAX_PATH_FEATURES",
    "LeafTables",
    "build",
]
