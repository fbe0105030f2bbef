"""BentoML's request timeout, with its timer dropped when the request ends.

BentoML 1.4's ``TimeoutMiddleware`` schedules ``loop.call_later(timeout, ...)`` for every
request and never cancels it. The timer keeps its waiter, and the copy of the request's
context it runs in (with the request's tracing span and scope), for the whole
``traffic.timeout``: about 5 KB a request, any route, ``/livez`` included. A worker's memory
thus grew with its request rate times 60 s (415 to 780 MB over 105,000 requests here,
2026-12-01). This subclass answers a timeout exactly as BentoML does (504 and its message)
and cancels the timer as soon as the request is done, so asyncio drops it at once.
Called by the service module before BentoML builds its app, as ``metrics.fold_unknown_paths``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import Message, Receive, Scope, Send

__all__ = ["cancel_request_timers"]


def cancel_request_timers() -> None:
    """Make BentoML build its timeout middleware from :class:`_CancelledTimeout` (BentoML
    imports the class when it builds the app, so call at import of the service module);
    idempotent."""
    from bentoml._internal.server.http import traffic

    if getattr(traffic.TimeoutMiddleware, "cancels_timer", False):
        return
    traffic.TimeoutMiddleware = _timeout_class(traffic.TimeoutMiddleware)


def _timeout_class(base: type) -> type:
    class _CancelledTimeout(base):  # type: ignore[misc, valid-type]
        cancels_timer = True

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] not in ("http", "websocket"):
                return await self.app(scope, receive, send)
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[Any] = loop.create_future()
            timer = loop.call_later(self.timeout, self._set_timer_out, waiter)

            async def started(message: Message) -> None:
                if not waiter.done():
                    waiter.set_result(None)
                await send(message)

            request = asyncio.ensure_future(self.app(scope, receive, started))
            # a request that fails before it answers is done too (BentoML's waits out the timer)
            request.add_done_callback(lambda _: waiter.done() or waiter.set_result(None))
            try:
                await waiter
            except asyncio.TimeoutError:
                if request.cancel():
                    message = f"Not able to process the request in {self.timeout} seconds"
                    await JSONResponse({"error": message}, status_code=504)(scope, receive, send)
            else:
                await request
            finally:
                timer.cancel()

    return _CancelledTimeout
