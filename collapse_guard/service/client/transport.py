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
100-continue`` and streamed bodies (whole bodies only, as RiskClient sends and reads):
pass ``transport=httpx.HTTPTransport()`` to RiskClient for those.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import weakref

import httpx

__all__ = ["KeepAliveTransport"]

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
        message = _head(request) + request.read()
        url = request.url
        key = (url.raw_scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        kept = self._kept().pop(key, None)
        if kept is not None:
            try:
                return self._exchange(kept, key, request, message, timeouts)
            except _STALE:
                kept.close()  # closed by the server while idle: once more, on a new socket
        sock = self._connect(key, request, timeouts)
        try:
            return self._exchange(sock, key, request, message, timeouts)
        except _STALE as error:
            sock.close()
            reason = f"{type(error).__name__}: {error}"
            raise httpx.RemoteProtocolError(reason, request=request) from error

    def _exchange(
        self, sock: socket.socket, key: _Key, request: httpx.Request, message: bytes, timeouts
    ) -> httpx.Response:
        """Send ``message``, read the whole answer, keep the socket unless it closes.

        A stale socket's error (:data:`_STALE`) goes to the caller as it is only before
        the answer began; once it has, the request is not sent again."""
        began = False
        try:
            sock.settimeout(timeouts.get("read"))
            sock.sendall(message)
            answer = http.client.HTTPResponse(sock, method=request.method)
            answer.begin()
            began = True
            content = answer.read()
            answer.close()  # its reader only: the socket stays open
        except (OSError, http.client.HTTPException) as error:
            if isinstance(error, _STALE) and not began:
                raise  # the caller sends it once more, on a new socket
            sock.close()
            if isinstance(error, TimeoutError):
                raise httpx.ReadTimeout(str(error) or "timed out", request=request) from error
            raise httpx.ReadError(f"{type(error).__name__}: {error}", request=request) from error
        if answer.will_close:
            sock.close()
        else:
            self._kept()[key] = sock
        return httpx.Response(
            answer.status,
            headers=answer.getheaders(),
            stream=httpx.ByteStream(content),
            extensions={"http_version": b"HTTP/1.1"},
            request=request,
        )

    def _connect(self, key: _Key, request: httpx.Request, timeouts) -> socket.socket:
        scheme, host, port = key
        try:
            sock = socket.create_connection((host, port), timeout=timeouts.get("connect"))
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


def _head(request: httpx.Request) -> bytes:
    """The request line and headers (httpx's: Host, Content-Length, ...), blank line included."""
    line = f"{request.method} {request.url.raw_path.decode('ascii')} HTTP/1.1".encode("ascii")
    return b"\r\n".join([line, *(name + b": " + value for name, value in request.headers.raw)]) + (
        b"\r\n\r\n"
    )
