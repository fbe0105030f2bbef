"""RiskClient reads an answer strictly and within bounds (issue 31, case 4).

A real loopback server (a socket per connection, started and stopped by a fixture) sends
the bytes a broken or hostile service could: a boolean or a string for a number, a level
or a ``hold_steps`` out of its range, 50 MB, one byte every 0.5 s. Each is the client's
own error (``InvalidAnswer``, ``AnswerTooLarge``, ``ServiceTimeout``: a
``RiskServiceError``) within ``timeout`` + 1 s, after at most ``max_answer_bytes`` (one
chunk more) read; through the default transport and through httpcore's.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator

import httpx
import numpy as np
import pytest

from collapse_guard.service.client import (
    AnswerTooLarge,
    InvalidAnswer,
    RiskClient,
    RiskServiceError,
    ServiceTimeout,
)
from collapse_guard.service.client.risk_client import DEFAULT_MAX_ANSWER_BYTES
from collapse_guard.service.client.transport import CHUNK

GOOD = {
    "run_id": "run",
    "step": 2,
    "probability": 0.02,
    "level": "ok",
    "horizon": 200,
    "hold_steps": 50,
    "model_name": "stand-in",
    "model_version": "v-test",
    "top_factors": [],
}
RUN = {"step": np.arange(3), "loss": np.ones(3)}
Answer = Callable[["Connection", str], None]  # writes an answer to a request for a path


class RawServer:
    """A loopback HTTP/1.1 server that reads each request (head and Content-Length body)
    and lets ``answer(connection, path)`` write whatever bytes it likes; ``sent`` counts
    the bytes it got onto the socket, ``stop`` ends a trickle."""

    def __init__(self, answer: Answer) -> None:
        self.answer, self.sent, self.connections = answer, 0, 0
        self.stop = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            thread = threading.Thread(target=self._serve, args=(connection,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            buffered = b""
            while not self.stop.is_set():
                try:
                    while b"\r\n\r\n" not in buffered:
                        data = connection.recv(65536)
                        if not data:
                            return
                        buffered += data
                    head, _, buffered = buffered.partition(b"\r\n\r\n")
                    lines = head.decode("latin-1").split("\r\n")
                    length = next(
                        (
                            int(v)
                            for k, _, v in (x.partition(":") for x in lines[1:])
                            if k.strip().lower() == "content-length"
                        ),
                        0,
                    )
                    while len(buffered) < length:
                        buffered += connection.recv(65536)
                    buffered = buffered[length:]
                    self.answer(self._counting(connection), lines[0].split(" ")[1])
                except OSError:  # the client hung up (as it should, for a hostile answer)
                    return

    def _counting(self, connection: socket.socket) -> Connection:
        return Connection(self, connection)

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        for thread in self._threads:
            thread.join(timeout=5)


class Connection:
    """What an answer writes to: the socket's ``sendall`` (counted), ``close`` and
    ``wait(seconds)`` (True once the server stops)."""

    def __init__(self, server: RawServer, sock: socket.socket) -> None:
        self._server, self._sock = server, sock

    def sendall(self, data: bytes) -> None:
        self._sock.sendall(data)
        self._server.sent += len(data)

    def close(self) -> None:
        self._sock.shutdown(socket.SHUT_RDWR)

    def wait(self, seconds: float) -> bool:
        return self._server.stop.wait(seconds)


@pytest.fixture
def serve() -> Iterator[Callable[[Answer], RawServer]]:
    started: list[RawServer] = []

    def start(answer: Answer) -> RawServer:
        started.append(RawServer(answer))
        return started[-1]

    yield start
    for server in started:
        server.close()


def _head(length: int | None = None, extra: str = "") -> bytes:
    size = "" if length is None else f"Content-Length: {length}\r\n"
    return f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{size}{extra}\r\n".encode()


def fixed(body: bytes) -> Answer:
    def answer(connection: Connection, path: str) -> None:
        connection.sendall(_head(len(body)) + body)

    return answer


def risk_answer(**fields) -> bytes:
    return json.dumps({"results": [{**GOOD, **fields}]}).encode()


class Counting(httpx.BaseTransport):
    """A transport around another that counts the answer bytes the client pulled."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner, self.read = inner, 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_CountedStream(response.stream, self),
            request=request,
        )

    def close(self) -> None:
        self.inner.close()


class _CountedStream(httpx.SyncByteStream):
    def __init__(self, inner, owner: Counting) -> None:
        self.inner, self.owner = inner, owner

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.inner:
            self.owner.read += len(chunk)
            yield chunk

    def close(self) -> None:
        self.inner.close()


TRANSPORTS = {"keep-alive": lambda: None, "httpcore": httpx.HTTPTransport}


# ------------------------------------------------------------- strictly typed answers
@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"probability": True, "level": "critical"}, "results.0.probability"),  # (a)
        ({"probability": "0.5"}, "results.0.probability"),  # (b)
        ({"hold_steps": "50"}, "results.0.hold_steps"),  # (c)
        ({"hold_steps": 50.0}, "results.0.hold_steps"),
        ({"hold_steps": True}, "results.0.hold_steps"),
        ({"hold_steps": -5}, "results.0.hold_steps"),
        ({"hold_steps": 10**9}, "results.0.hold_steps"),
        ({"probability": 1.5}, "results.0.probability"),
        ({"probability": -0.1}, "results.0.probability"),
        ({"level": "WARN"}, "results.0.level"),
        ({"level": 3}, "results.0.level"),
        ({"step": "9"}, "results.0.step"),
        ({"step": False}, "results.0.step"),
    ],
    ids=(
        "p-true p-str hold-str hold-float hold-bool hold-5 hold1e9 p1.5 p-0.1 level-case "
        "level-int step-str step-bool"
    ).split(),
)
def test_an_answer_that_is_not_its_wire_type_is_refused_never_coerced(serve, fields, named):
    server = serve(fixed(risk_answer(**fields)))
    with RiskClient(server.url, timeout=2.0, top_k=0) as client:
        with pytest.raises(InvalidAnswer, match="refused") as caught:
            client.risk(RUN)
    assert named in str(caught.value) and isinstance(caught.value, RiskServiceError)
    assert server.url in str(caught.value)


def test_a_non_finite_probability_is_refused(serve):
    # the bare literal NaN, as Python's json writes it: a float to pydantic, no probability
    server = serve(fixed(risk_answer().replace(b'"probability": 0.02', b'"probability": NaN')))
    with RiskClient(server.url, timeout=2.0, top_k=0) as client:
        with pytest.raises(InvalidAnswer, match=r"probability nan: expected a number in \[0, 1\]"):
            client.risk(RUN)


def test_a_well_typed_answer_is_read_as_before(serve):
    # a JSON integer is a number (0, 1), every level by its name
    answers = iter(
        [risk_answer(probability=0, level="ok"), risk_answer(probability=1, level="critical")]
    )

    def answer(connection: Connection, path: str) -> None:
        fixed(next(answers))(connection, path)

    server = serve(answer)
    with RiskClient(server.url, timeout=2.0, top_k=0) as client:
        low, high = client.risk(RUN), client.risk(RUN)
    assert (low.probability, low.level, low.hold_steps) == (0.0, "ok", 50)
    assert (high.probability, high.level) == (1.0, "critical")
    assert server.connections == 1  # a whole answer keeps its connection


def test_as_many_results_as_runs_or_the_answer_is_refused(serve):
    server = serve(fixed(json.dumps({"results": [GOOD, GOOD]}).encode()))
    with RiskClient(server.url, timeout=2.0, top_k=0) as client:
        with pytest.raises(InvalidAnswer, match="2 results for 1 runs"):
            client.risk(RUN)


def test_model_info_is_read_strictly_too(serve):
    info = {
        "name": "m", "version": "v", "alias": None, "source": "default", "horizon": 200,
        "hold_steps": "50", "levels": ["ok", "watch", "warn", "critical"],
        "feature_schema": {"version": "1", "window": 200, "signals": [], "context": [],
                           "fingerprint": "f", "names": []},
        "thresholds": {"watch": "0.1", "warn": 0.2, "critical": 0.3},
        "budgets": {}, "trained_at": None, "evaluation": {}, "meta": {},
    }  # fmt: skip
    server = serve(fixed(json.dumps(info).encode()))
    with RiskClient(server.url, timeout=2.0) as client:
        with pytest.raises(InvalidAnswer) as caught:
            client.model_info()
    assert "hold_steps" in str(caught.value) and "thresholds.watch" in str(caught.value)


# ------------------------------------------------------------------ bounded in size
def _fifty_megabytes(framing: str) -> Answer:
    """50 MB of a JSON string's bytes, declared, chunked or read until the close."""
    size, piece = 50 * 1024 * 1024, b"x" * CHUNK

    def answer(connection: Connection, path: str) -> None:
        if framing == "declared":
            connection.sendall(_head(size) + b'{"results": "')
        elif framing == "chunked":
            connection.sendall(_head(None, "Transfer-Encoding: chunked\r\n"))
        else:
            connection.sendall(_head(None, "Connection: close\r\n"))
        for _ in range(size // len(piece)):
            if framing == "chunked":
                connection.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
            else:
                connection.sendall(piece)
        connection.close()

    return answer


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("framing", ["declared", "chunked", "until-close"])
def test_a_50_MB_answer_is_refused_after_at_most_the_bound(serve, framing, transport):
    server = serve(_fifty_megabytes(framing))
    counting = Counting(TRANSPORTS[transport]() or _default_transport())
    tracemalloc.start()
    started = time.monotonic()
    try:
        with RiskClient(server.url, timeout=10.0, top_k=0, transport=counting) as client:
            with pytest.raises(AnswerTooLarge, match="max_answer_bytes"):
                client.risk(RUN)
        took = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert counting.read <= DEFAULT_MAX_ANSWER_BYTES + CHUNK
    if framing == "declared":
        assert counting.read == 0  # refused by its Content-Length, unread
    assert peak < 2 * DEFAULT_MAX_ANSWER_BYTES + 4 * CHUNK  # not 50 MB, not 300 MB
    assert took < 10.0


def test_the_bound_is_the_clients_to_choose_and_a_refusal_leaves_the_client_usable(serve):
    calls = iter(
        [b'{"results": [' + b" " * 5000 + json.dumps(GOOD).encode() + b"]}", risk_answer()]
    )

    def answer(connection: Connection, path: str) -> None:
        fixed(next(calls))(connection, path)

    server = serve(answer)
    with RiskClient(server.url, timeout=2.0, top_k=0, max_answer_bytes=4096) as client:
        with pytest.raises(AnswerTooLarge, match="Content-Length 5"):
            client.risk(RUN)
        assert client.risk(RUN).probability == GOOD["probability"]  # on a new connection
    assert server.connections == 2
    for bad in (0, -1, 1.5, True, "8M"):
        with pytest.raises(ValueError, match="max_answer_bytes"):
            RiskClient(server.url, max_answer_bytes=bad)


# ------------------------------------------------------------------ bounded in time
def _trickle(head_too: bool) -> Answer:
    """One byte every 0.5 s: of the body after a whole head, or of the head itself."""

    def answer(connection: Connection, path: str) -> None:
        head = _head(1_000_000)
        if not head_too:
            connection.sendall(head)
        for byte in (head if head_too else b"") + b'{"results": [' + b" " * 999_000:
            if connection.wait(0.5):
                return
            connection.sendall(bytes([byte]))

    return answer


@pytest.mark.parametrize(
    ("transport", "head_too"),
    [("keep-alive", False), ("keep-alive", True), ("httpcore", False)],
    ids=["body", "head", "httpcore-body"],
)
def test_an_answer_trickling_a_byte_every_half_second_ends_at_the_timeout(
    serve, transport, head_too
):
    server = serve(_trickle(head_too))
    timeout = 2.0  # the issue's: 92 s had passed, and no answer, at 1 byte per 1.5 s
    client = RiskClient(server.url, timeout=timeout, top_k=0, transport=TRANSPORTS[transport]())
    started = time.monotonic()
    with client, pytest.raises(ServiceTimeout):
        client.risk(RUN)
    took = time.monotonic() - started
    assert timeout - 0.1 <= took <= timeout + 1.0, took
    assert server.sent >= 2  # it was answering, a byte at a time


def test_an_httpx_timeout_gives_each_phase_its_limit_and_their_sum_in_all(serve):
    server = serve(_trickle(False))
    phases = httpx.Timeout(connect=0.5, read=1.0, write=0.5, pool=9.0)  # 2 s in all
    started = time.monotonic()
    with RiskClient(server.url, timeout=phases, top_k=0) as client:
        assert client.total_timeout == 2.0
        with pytest.raises(ServiceTimeout):
            client.risk(RUN)
    assert time.monotonic() - started <= 3.0


# ------------------------------------------------------------------------- helpers
def _default_transport() -> httpx.BaseTransport:
    from collapse_guard.service.client.transport import KeepAliveTransport

    return KeepAliveTransport()
