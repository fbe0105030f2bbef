"""An httpx transport for small whole requests: one write out, ``http.client`` reading in.

httpcore (httpx's default transport) writes a request's headers and its body in two
``send`` calls, so the service is woken twice per request (its HTTP parser starts the
route on the headers, then waits for the body), and runs each exchange through h11's
pure-Python state machine; ``http.client`` also sends the two apart. Here a request is
one ``sendall`` of its head and body, and its answer is parsed by
``http.client.HTTPResponse``. Measured on the 2-core machine, the one-window Arrow body
to a 1-worker service, 1,500 requests each, interleaved, 2026-11-30 (load ~1.5):
httpcore p50 5.36 / p99 9.46 ms and 2.3 ms of client CPU a call; ``http.client``
3.87 / 7.42 ms, 0.62; this transport 3.50 / 6.66 ms, 0.45.

One socket is kept per thread and host (a ``RiskClient`` may be shared by threads; one
exchange at a time fits a socket), opened on first use and reused; a request that fails
on a kept socket before its answer began (the server closed it while idle) is sent once
more on a new one. Errors become httpx's own exceptions, so the client maps them as
before. Not handled here: HTTP/2, proxies from the environment, ``Expect:
100-continue`` and streamed request bodies (whole bodies only, as RiskClient sends):
pass ``transport=httpx.HTTPTransport()`` to RiskClient for those.

Time. Besides httpx's per-phase timeouts (``connect``, ``write``, ``read``: each read
waits at most that long), a request may carry a deadline, a ``time.monotonic()`` value
in its :data:`DEADLINE` extension (RiskClient sets it: its whole-request timeout): every
socket operation, the connect, the send and each read of the head and the body, waits
at most until then, so an answer that trickles in a byte at a time ends at the deadline
with ``httpx.ReadTimeout``, not after one read timeout per byte.

The body is streamed: the answer's stream reads it in chunks of at most :data:`CHUNK`
bytes (one ``recv`` each), so a reader can stop after as many bytes as it accepts
(RiskClient's ``max_answer_bytes``); a socket whose answer was read to its end is kept,
one closed before that is closed.
"""

from __future__ import annotations

import http.client
import io
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Iterator

import httpx

__all__ = ["CHUNK", "DEADLINE", "KeepAliveTransport"]

DEADLINE = "collapse_guard.deadline"  # request extension: time.monotonic() the answer must end by
CHUNK = 65_536  # bytes of the body read at most at a time (one recv)

# failures of a kept socket that the server closed while it was idle
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)
_Key = tuple[bytes, str, int]  # scheme, host, port


class KeepAliveTransport(httpx.BaseTransport):
    """Whole requests over kept sockets, one per thread and host; one write a request."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self._ssl_context = ssl_context
        self._local = threading.local()
        self._lock = threading.Lock()
        self._every: weakref.WeakSet[socket.socket] = weakref.WeakSet()  # for close()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        deadline = request.extensions.get(DEADLINE)
        message = _head(request) + request.read()
        url = request.url
        key = (url.raw_scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        kept = self._kept().pop(key, None)
        if kept is not None:
            try:
                return self._exchange(kept, key, request, message, timeouts, deadline)
            except _STALE:
                kept.close()  # closed by the server while idle: once more, on a new socket
        sock = self._connect(key, request, timeouts, deadline)
        try:
            return self._exchange(sock, key, request, message, timeouts, deadline)
        except _STALE as error:
            sock.close()
            reason = f"{type(error).__name__}: {error}"
            raise httpx.RemoteProtocolError(reason, request=request) from error

    def _exchange(
        self,
        sock: socket.socket,
        key: _Key,
        request: httpx.Request,
        message: bytes,
        timeouts,
        deadline: float | None,
    ) -> httpx.Response:
        """Send ``message`` and read the answer's head; its body is the answer's stream.

        A stale socket's error (:data:`_STALE`) goes to the caller as it is only before
        the answer began; once it has, the request is not sent again."""
        began = False
        try:
            sock.settimeout(_within(timeouts.get("write"), deadline))
            sock.sendall(message)  # one timeout for the whole send (Python >= 3.5)
            answer = http.client.HTTPResponse(
                _Timed(sock, timeouts.get("read"), deadline), method=request.method
            )
            answer.begin()
            began = True
        except (OSError, http.client.HTTPException) as error:
            if isinstance(error, _STALE) and not began:
                raise  # the caller sends it once more, on a new socket
            sock.close()
            raise _read_error(error, request) from error
        return httpx.Response(
            answer.status,
            headers=answer.getheaders(),
            stream=_Body(self, sock, key, answer, request),
            extensions={"http_version": b"HTTP/1.1"},
            request=request,
        )

    def _connect(
        self, key: _Key, request: httpx.Request, timeouts, deadline: float | None
    ) -> socket.socket:
        scheme, host, port = key
        try:
            timeout = _within(timeouts.get("connect"), deadline)
            sock = socket.create_connection((host, port), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no Nagle wait
            if scheme == b"https":
                context = self._ssl_context or ssl.create_default_context()
                sock = context.wrap_socket(sock, server_hostname=host)
        except TimeoutError as error:
            raise httpx.ConnectTimeout(str(error) or "timed out", request=request) from error
        except OSError as error:
            raise httpx.ConnectError(f"{type(error).__name__}: {error}", request=request) from error
        with self._lock:
            self._every.add(sock)
        return sock

    def _kept(self) -> dict[_Key, socket.socket]:
        kept = getattr(self._local, "kept", None)
        if kept is None:
            kept = self._local.kept = {}
        return kept

    def close(self) -> None:
        with self._lock:
            every = list(self._every)
        for sock in every:
            sock.close()


class _Body(httpx.SyncByteStream):
    """An answer's body, one ``recv`` a chunk; its socket is kept once the body was read
    to its end (unless the answer closes it), closed when the body is left unread."""

    def __init__(
        self,
        transport: KeepAliveTransport,
        sock: socket.socket,
        key: _Key,
        answer: http.client.HTTPResponse,
        request: httpx.Request,
    ) -> None:
        self._transport, self._sock, self._key = transport, sock, key
        self._answer, self._request = answer, request
        self._done = False

    def __iter__(self) -> Iterator[bytes]:
        if self._done:
            return
        while True:
            try:
                chunk = self._answer.read1(CHUNK)
            except (OSError, http.client.HTTPException) as error:
                self._drop()
                raise _read_error(error, self._request) from error
            if not chunk:
                break
            yield chunk
        self._done = True
        will_close = self._answer.will_close
        self._answer.close()  # its reader only: the socket stays open
        if will_close:
            self._sock.close()
        else:
            self._transport._kept()[self._key] = self._sock

    def close(self) -> None:
        if not self._done:  # left before its end: the rest of the body is still on the socket
            self._drop()

    def _drop(self) -> None:
        self._done = True
        self._answer.close()
        self._sock.close()


class _Timed:
    """The socket as ``http.client.HTTPResponse`` reads it (``makefile("rb")``), each
    ``recv`` waiting at most the read timeout and never past the deadline."""

    def __init__(self, sock: socket.socket, read: float | None, deadline: float | None) -> None:
        self._sock, self._read, self._deadline = sock, read, deadline

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_TimedReader(self._sock, self._read, self._deadline))


class _TimedReader(io.RawIOBase):
    def __init__(self, sock: socket.socket, read: float | None, deadline: float | None) -> None:
        self._sock, self._read, self._deadline = sock, read, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        self._sock.settimeout(_within(self._read, self._deadline))
        return self._sock.recv_into(buffer)

    def close(self) -> None:  # the reader only: the socket is its transport's to keep or close
        super().close()


def _within(timeout: float | None, deadline: float | None) -> float | None:
    """``timeout``, cut to what is left before ``deadline``; TimeoutError once it passed."""
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the request's deadline passed")
    return left if timeout is None else min(timeout, left)


def _read_error(error: Exception, request: httpx.Request) -> httpx.TransportError:
    if isinstance(error, TimeoutError):
        return httpx.ReadTimeout(str(error) or "timed out", request=request)
    return httpx.ReadError(f"{type(error).__name__}: {error}", request=request)


def _head(request: httpx.Request) -> bytes:
    """The request line and headers (httpx's: Host, Content-Length, ...), blank line included."""
    line = f"{request.method} {request.url.raw_path.decode('ascii')} HTTP/1.1".encode("ascii")
    return b"\r\n".join([line, *(name + b": " + value for name, value in request.headers.raw)]) + (
        b"\r\n\r\n"
    )
