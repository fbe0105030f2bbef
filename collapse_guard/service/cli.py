"""Moved to :mod:`collapse_guard.service.server.serve_command`;
this path is kept for one release."""

from collapse_guard.service.server.serve_command import (
    SERVICE,
    serve_command,
    serve_environment,
)

__all__ = [
    "SERVICE",
    "serve_command",
    "serve_environment",
]
