"""BentoML's request timeout, whose timer is dropped once the request is done."""

from __future__ import annotations

import asyncio
import json

import pytest

from collapse_guard.service.middleware.timeout import cancel_request_timers


@pytest.fixture(scope="module")
def timeout_class():
    from bentoml._internal.server.http import traffic

    cancel_request_timers()
    cancel_request_timers()  # idempotent: one subclass, not a subclass of a subclass
    assert traffic.TimeoutMiddleware.__mro__[1].__name__ == "TimeoutMiddleware"
    return traffic.TimeoutMiddleware


def _answer(seconds: float, fail: bool = False):
    async def app(scope, receive, send):
        await asyncio.sleep(seconds)
        if fail:
            raise RuntimeError("the app failed before it answered")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return app


async def _call(middleware) -> tuple[list[dict], int]:
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b""}

    try:
        await middleware({"type": "http", "path": "/livez"}, receive, send)
    except RuntimeError:
        pass
    await asyncio.sleep(0)  # a cancelled app's own sleep ends at its next turn
    loop = asyncio.get_running_loop()
    # asyncio's own list of timers: the request's is cancelled, so it holds nothing
    live = [h for h in loop._scheduled if not h.cancelled()]
    return sent, len(live)


def test_a_request_in_time_answers_and_leaves_no_live_timer(timeout_class):
    sent, live = asyncio.run(_call(timeout_class(_answer(0.0), timeout=60)))
    assert [m.get("status") for m in sent[:1]] == [200] and sent[1]["body"] == b"ok"
    assert live == 0


def test_a_slow_request_is_a_504_with_bentomls_message(timeout_class):
    sent, live = asyncio.run(_call(timeout_class(_answer(5.0), timeout=0.05)))
    assert sent[0]["status"] == 504
    message = "Not able to process the request in 0.05 seconds"
    assert json.loads(sent[1]["body"]) == {"error": message}
    assert live == 0


def test_a_request_that_fails_does_not_wait_out_the_timer(timeout_class):
    async def timed():
        loop = asyncio.get_running_loop()
        start = loop.time()
        sent, live = await _call(timeout_class(_answer(0.0, fail=True), timeout=30))
        return sent, live, loop.time() - start

    sent, live, seconds = asyncio.run(timed())
    assert sent == [] and live == 0
    assert seconds < 5  # BentoML's waited the whole 30 s
