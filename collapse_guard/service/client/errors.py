"""What the client raises: one small hierarchy (after httpx's own), all :class:`RiskServiceError`.

:class:`ServiceUnavailable` (cannot connect, connection lost, 5xx), :class:`ServiceTimeout`
(no whole answer within the client's timeout), :class:`RequestRejected` (a 4xx, with the
server's message) and :class:`InvalidAnswer` (a 2xx that is not the route's answer, read
strictly; :class:`AnswerTooLarge`: longer than the client reads).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "AnswerTooLarge",
    "InvalidAnswer",
    "RequestRejected",
    "RiskServiceError",
    "ServiceTimeout",
    "ServiceUnavailable",
]


class RiskServiceError(Exception):
    """Base of every error the client raises."""


class ServiceUnavailable(RiskServiceError):
    """The service cannot be reached, dropped the connection, or failed (5xx)."""


class ServiceTimeout(RiskServiceError):
    """No whole answer within the client's timeout (connect, send and every read together)."""


class RequestRejected(RiskServiceError):
    """The service refused the request (4xx); ``message`` is its explanation."""

    def __init__(self, status: int, message: str, body: Mapping[str, Any] | None = None):
        self.status, self.message, self.body = status, message, dict(body or {})
        self.field = self.body.get("field")
        super().__init__(f"HTTP {status}: {message}")


class InvalidAnswer(RiskServiceError):
    """The service answered, but not with the route's answer: a body that is not its wire
    type read strictly (a boolean or a string for a number, an unknown level), or a value
    out of range (a probability outside [0, 1], a ``hold_steps`` outside its bound)."""


class AnswerTooLarge(InvalidAnswer):
    """An answer longer than the client's ``max_answer_bytes``: refused, the rest unread."""
