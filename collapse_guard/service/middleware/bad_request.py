"""Request errors: every bad input becomes a 4xx that names the field, what was
expected and how to fix it; never a 5xx.

:class:`BadRequest` is raised anywhere below the routes and by the middleware; each turns
it into a JSON :class:`~collapse_guard.service.client.wire.ErrorBody`. :func:`from_validation` turns
pydantic's errors into the same shape.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

__all__ = ["BadRequest", "field_path", "from_validation"]

NUMBER_EXPECTED = (
    'a number, null (not measured), or "NaN" / "Infinity" / "-Infinity" (measured non-finite)'
)

# pydantic error type -> (what was expected, how to fix it)
_EXPECTED: dict[str, tuple[str, str]] = {
    "float_parsing": (NUMBER_EXPECTED, 'send numbers; write non-finite values as "NaN"'),
    "float_type": (NUMBER_EXPECTED, 'send numbers; write non-finite values as "NaN"'),
    "finite_number": (NUMBER_EXPECTED, "send numbers"),
    "int_parsing": ("a whole number", "send training steps as integers"),
    "int_type": ("a whole number", "send training steps as integers"),
    "int_from_float": ("a whole number", "send training steps as integers"),
    "list_type": ("a JSON array", "send one array per column"),
    "dict_type": ("a JSON object", "send an object of name -> value"),
    "string_type": ("a string", "quote the value"),
    "missing": ("the field to be present", "add it (see /docs.json)"),
    "model_type": ("a JSON object", "send an object (see /docs.json)"),
    "model_attributes_type": ("a JSON object", "send an object (see /docs.json)"),
    "json_invalid": (
        "a JSON document (NaN/Infinity literals allowed)",
        "check the body with a JSON parser; send Content-Type: application/json",
    ),
    "json_type": ("a JSON document", "send a JSON object"),
    "too_short": ("at least one item", "add one (see /docs.json)"),
    "greater_than_equal": ("a number within the documented range", "see /docs.json"),
    "less_than_equal": ("a number within the documented range", "see /docs.json"),
}


class BadRequest(Exception):
    """A request the service will not score; ``status`` is a 4xx.

    ``field``: where (``runs[2].signals.loss``); ``got``: what was there; ``expected``
    and ``fix``: what to send instead.
    """

    def __init__(
        self,
        field: str | None,
        got: str,
        expected: str,
        fix: str,
        *,
        status: int = 400,
        details: list[dict[str, Any]] | None = None,
    ) -> None:
        self.field, self.got, self.expected, self.fix = field, got, expected, fix
        self.status = status
        self.details = details or []
        where = f"{field}: " if field else ""
        super().__init__(f"{where}{got}; expected {expected}. Fix: {fix}")

    def body(self) -> dict[str, Any]:
        """The JSON body of the answer (ErrorBody)."""
        out: dict[str, Any] = {
            "error": str(self),
            "field": self.field,
            "expected": self.expected,
            "fix": self.fix,
        }
        if self.details:
            out["details"] = self.details
        return out


def field_path(loc: tuple[int | str, ...] | list[int | str]) -> str:
    """``("runs", 0, "signals", "loss", 3)`` -> ``runs[0].signals.loss[3]``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "body"


def from_validation(error: ValidationError, *, limit: int = 10) -> BadRequest:
    """The first of pydantic's errors as a BadRequest; up to ``limit`` in ``details``."""
    errors = error.errors(include_url=False, include_context=False, include_input=False)
    details = [{"field": field_path(e["loc"]), "problem": e["msg"]} for e in errors[:limit]]
    first = errors[0]
    expected, fix = _EXPECTED.get(first["type"], ("a value of the documented type", ""))
    return BadRequest(
        field_path(first["loc"]),
        f"{first['msg']} ({len(errors)} problem{'s' if len(errors) > 1 else ''} in all)",
        expected,
        fix or "see the request schema at /docs.json",
        details=details,
    )
