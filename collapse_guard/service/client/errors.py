"""What the client raises: one small hierarchy (after httpx's own), all :class:`RiskServiceError`.

:class:`ServiceUnavailable` (cannot connect, connection lost, 5xx), :class:`ServiceTimeout`,
and :class:`RequestRejected` (a 4xx, with the server's message).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["RequestRejected", "RiskServiceError", "ServiceTimeout", "ServiceUnavailable"]


class RiskServiceError(Exception):
    """Base of every error the client raises."""


class ServiceUnavailable(RiskServiceError):
    """The service cannot be reached, dropped the connection, or failed (5xx)."""


class ServiceTimeout(RiskServiceError):
    """No answer within the client's timeout."""


class RequestRejected(RiskServiceError):
    """The service refused the request (4xx); ``message`` is its explanation."""

    def __init__(self, status: int, message: str, body: Mapping[str, Any] | None = None):
        self.status, self.message, self.body = status, message, dict(body or {})
        self.field = self.body.get("field")
        super().__init__(f"HTTP {status}: {message}")
