"""OpenAPI pieces for routes that read their body themselves (JSON or Arrow).

FastAPI documents a body only when a parameter declares it; ``/risk`` and ``/explain``
read the raw body to choose between JSON and Arrow, so their request body is described
here, with the JSON schema inlined (BentoML merges only the mounted app's paths and
components into ``/docs.json``, so ``#/$defs`` references would dangle).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from collapse_guard.service.client.arrow_writer import ARROW_TYPE
from collapse_guard.service.client.wire import ERROR_EXAMPLE, ErrorBody

__all__ = ["ERROR_RESPONSES", "body_of"]


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _inline(defs[ref.removeprefix("#/$defs/")], defs)
        return {k: _inline(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


def body_of(model: type[BaseModel], *, arrow: bool = True, required: bool = True) -> dict[str, Any]:
    """``openapi_extra`` declaring ``model`` as the JSON body, and optionally Arrow
    (``required=False``: no body at all is read as ``{}``)."""
    schema = model.model_json_schema()
    content: dict[str, Any] = {
        "application/json": {"schema": _inline(schema, schema.get("$defs", {}))}
    }
    if arrow:
        content[ARROW_TYPE] = {
            "schema": {"type": "string", "format": "binary"},
            "description": "Arrow IPC stream: 'step', 'run_id', signal and 'context.<name>' "
            "columns (see collapse_guard/service/client/arrow_writer.py); '?top_k=' in the query",
        }
    return {"requestBody": {"required": required, "content": content}}


_ERROR = {"model": ErrorBody, "content": {"application/json": {"example": ERROR_EXAMPLE}}}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {**_ERROR, "description": "Bad input: the message names the field and the fix."},
    401: {**_ERROR, "description": "No bearer token (COLLAPSE_GUARD_TOKEN is set)."},
    403: {**_ERROR, "description": "Wrong bearer token."},
    408: {**_ERROR, "description": "The body stopped arriving (a pause of 5 s by default)."},
    413: {**_ERROR, "description": "Body over the size limit."},
    415: {**_ERROR, "description": "Content-Type is neither JSON nor Arrow."},
}
