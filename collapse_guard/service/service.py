"""Moved to :mod:`collapse_guard.service.server.risk_service`; this path is kept for one release."""

from collapse_guard.service.server.risk_service import (
    MODEL_ENV,
    POLL_ENV,
    WORKERS_ENV,
    RiskService,
    app,
)

__all__ = [
    "MODEL_ENV",
    "POLL_ENV",
    "WORKERS_ENV",
    "RiskService",
    "app",
]
