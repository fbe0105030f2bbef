"""Refuse request bodies over the size limit with 413, and stalled ones with 408,
before anything parses them.

BentoML has no limit of its own (docs/stack.md, "BentoML 1.4": a 123 MB body was parsed, 1.2 GB of
worker memory). A ``Content-Length`` header is not enough: a chunked body has none, so
this middleware counts the bytes as they arrive and stops keeping them past the limit.
It goes on reading (and dropping) up to another limit's worth, so that an ordinary
client that sends its whole body before reading the answer gets the 413 rather than a
broken connection; past that it answers at once and the server closes the connection.

A body that stops arriving (no byte for ``Limits.body_idle_seconds``) is answered 408
and its connection closed: uvicorn has no body read timeout, so a declared 40 MB of
which 2 bytes came held the request until BentoML's 60 s traffic timeout.
"""

from __future__ import annotations

import anyio
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from collapse_guard.service.middleware.bad_request import BadRequest
from collapse_guard.service.middleware.limits import Limits

__all__ = ["BodyLimit"]

_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})


class BodyLimit:
    """ASGI middleware; ``max_bytes`` defaults to :class:`Limits`' ``max_body_bytes``."""

    def __init__(
        self, app: ASGIApp, max_bytes: int | None = None, idle_seconds: float | None = None
    ) -> None:
        self.app = app
        limits = Limits.from_env()
        self.max_bytes = max_bytes or limits.max_body_bytes
        self.idle_seconds = idle_seconds or limits.body_idle_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _WITH_BODY:
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > 2 * self.max_bytes:
            await self._refuse(int(declared), scope, receive, send)
            return
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await self._next(receive)
            if message is None:
                await self._stalled(size, declared, scope, receive, send)
                return
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            more = message.get("more_body", False)
            if size <= self.max_bytes:
                chunks.append(body)
            elif size > 2 * self.max_bytes:
                break
        if size > self.max_bytes:
            await self._refuse(size, scope, receive, send, at_least=more)
            return
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _next(self, receive: Receive) -> Message | None:
        """The next message, or None when none came within ``idle_seconds``."""
        with anyio.move_on_after(self.idle_seconds):
            return await receive()
        return None

    async def _stalled(
        self, size: int, declared: bytes | None, scope: Scope, receive: Receive, send: Send
    ) -> None:
        of = f" of the {int(declared):,} declared" if declared and declared.isdigit() else ""
        error = BadRequest(
            "body",
            f"{size:,} bytes{of}, then nothing for {self.idle_seconds} s",
            "the whole body, sent without a pause",
            "send the body with the request (COLLAPSE_GUARD_BODY_IDLE_SECONDS on the server)",
            status=408,
        )
        # the rest of the body may still come: this connection cannot carry another request
        answer = JSONResponse(error.body(), 408, headers={"Connection": "close"})
        await answer(scope, receive, send)

    async def _refuse(
        self, size: int, scope: Scope, receive: Receive, send: Send, at_least: bool = False
    ) -> None:
        error = BadRequest(
            "body",
            f"{'more than ' if at_least else ''}{size:,} bytes",
            f"at most {self.max_bytes:,} bytes (COLLAPSE_GUARD_MAX_BODY_BYTES on the server)",
            "split the runs into several requests, or send Arrow (about half the bytes)",
            status=413,
        )
        await JSONResponse(error.body(), 413)(scope, receive, send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the whole body once, then the real channel."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
