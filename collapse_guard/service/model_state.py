"""Moved to :mod:`collapse_guard.service.server.model_state`; this path is kept for one release."""

from collapse_guard.service.server.model_state import (
    DEFAULT_SOURCE,
    ModelHolder,
    ModelLoadError,
    ReloadBusy,
    Serving,
    alias_of,
    known_window,
    load_serving,
    public_source,
    scrub_paths,
)

__all__ = [
    "DEFAULT_SOURCE",
    "ModelHolder",
    "ModelLoadError",
    "ReloadBusy",
    "Serving",
    "alias_of",
    "known_window",
    "load_serving",
    "public_source",
    "scrub_paths",
]
