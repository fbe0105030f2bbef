"""Moved to :mod:`collapse_guard.service.client.transport`; this path is kept for one release."""

from collapse_guard.service.client.transport import (
    KeepAliveTransport,
)

__all__ = [
    "KeepAliveTransport",
]
