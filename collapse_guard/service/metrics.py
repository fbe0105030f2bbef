"""Moved to :mod:`collapse_guard.service.middleware.metrics`; this path is kept for one release."""

from collapse_guard.service.middleware.metrics import (
    OTHER_PATH,
    Metrics,
    fold_unknown_paths,
    metrics,
)

__all__ = [
    "OTHER_PATH",
    "Metrics",
    "fold_unknown_paths",
    "metrics",
]
