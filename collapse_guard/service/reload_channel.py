"""Moved to :mod:`collapse_guard.service.server.reload_channel`;
this path is kept for one release."""

from collapse_guard.service.server.reload_channel import (
    FOLLOW_SECONDS,
    Follower,
    ReloadChannel,
    registry_version,
)

__all__ = [
    "FOLLOW_SECONDS",
    "Follower",
    "ReloadChannel",
    "registry_version",
]
