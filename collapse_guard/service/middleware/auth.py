"""Bearer-token check for every route but the health probes (ASGI middleware).

With ``COLLAPSE_GUARD_TOKEN`` set, a request needs ``Authorization: Bearer <token>``:
401 without it, 403 with a wrong one. Tokens are compared in constant time
(``hmac.compare_digest``). ``/livez``, ``/readyz`` and ``/healthz`` stay open so that a
load balancer or Kubernetes can probe without the secret. Unset: everything is open.
"""

from __future__ import annotations

import hmac
import os

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from collapse_guard.service.middleware.bad_request import BadRequest

__all__ = ["OPEN_PATHS", "TOKEN_ENV", "BearerAuth"]

TOKEN_ENV = "COLLAPSE_GUARD_TOKEN"
OPEN_PATHS = frozenset({"/livez", "/readyz", "/healthz"})


class BearerAuth:
    """ASGI middleware; ``token`` defaults to ``$COLLAPSE_GUARD_TOKEN`` (empty: off)."""

    def __init__(self, app: ASGIApp, token: str | None = None) -> None:
        self.app = app
        self.token = (token if token is not None else os.environ.get(TOKEN_ENV, "")).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.token or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, given = header.partition(b" ")
        if scheme.lower() != b"bearer" or not given.strip():
            error = BadRequest(
                "Authorization",
                "no bearer token",
                "the header 'Authorization: Bearer <token>'",
                f"send the token the service was started with ({TOKEN_ENV})",
                status=401,
            )
        elif not hmac.compare_digest(given.strip(), self.token):
            error = BadRequest(
                "Authorization",
                "a token that does not match",
                "the service's token",
                f"check the token ({TOKEN_ENV} on the server)",
                status=403,
            )
        else:
            await self.app(scope, receive, send)
            return
        headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
        await JSONResponse(error.body(), error.status, headers=headers)(scope, receive, send)
