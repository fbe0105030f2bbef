"""KeepAliveTransport (RiskClient's default): one write per request, kept connections,
a retry when the server closed a kept one, one connection per thread, httpx's errors."""

from __future__ import annotations

import socket
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from helpers import TOKEN, window

from collapse_guard.service import RiskClient, ServiceUnavailable
from collapse_guard.service.client.transport import KeepAliveTransport


class _Echo(BaseHTTPRequestHandler):
    """Answers with the body it got and the number of the connection; after the first
    answer on a connection it closes it without saying so when ``drop_after_one``."""

    protocol_version = "HTTP/1.1"
    connections = 0
    drop_after_one = False

    def setup(self) -> None:
        super().setup()
        type(self).connections += 1
        self.number = type(self).connections

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        answer = f"{self.number}:{self.path}:".encode() + body
        self.send_response(200)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)
        if self.drop_after_one:  # as a server whose idle keep-alive timeout has passed
            self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def echo():
    handler = type("Echo", (_Echo,), {"connections": 0})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield handler, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_requests_share_one_kept_connection(echo):
    handler, url = echo
    with httpx.Client(base_url=url, transport=KeepAliveTransport()) as http:
        answers = [http.post(f"/p?i={i}", content=b"x" * i).content for i in range(5)]
    assert answers == [f"1:/p?i={i}:".encode() + b"x" * i for i in range(5)]
    assert handler.connections == 1


def test_a_connection_the_server_closed_while_idle_is_replaced_once(echo):
    handler, url = echo
    handler.drop_after_one = True
    with httpx.Client(base_url=url, transport=KeepAliveTransport()) as http:
        answers = [http.post("/p", content=b"abc").content for _ in range(3)]
    assert answers == [b"1:/p:abc", b"2:/p:abc", b"3:/p:abc"]  # each on a new connection
    assert handler.connections == 3


def test_a_connection_reset_after_the_answer_began_is_not_sent_again():
    """Only a kept socket that fails before its answer began is retried: a request the
    server already answered in part may have been acted on."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        port = server.getsockname()[1]
        requests = []

        def serve() -> None:
            connection, _ = server.accept()
            requests.append(connection.recv(65536))
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            requests.append(connection.recv(65536))
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart")
            # an abortive close: the client reads a reset in the middle of the body
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            connection.close()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, transport=KeepAliveTransport()) as http:
            assert http.post("/a", content=b"1").content == b"ok"
            with pytest.raises(httpx.ReadError, match="ConnectionResetError"):
                http.post("/b", content=b"2")
        thread.join(timeout=5)
    assert len(requests) == 2  # no third request on a new connection


def test_each_thread_keeps_its_own_connection(echo):
    handler, url = echo
    with httpx.Client(base_url=url, transport=KeepAliveTransport()) as http:

        def calls(thread: int) -> set[bytes]:
            return {http.post("/p", content=b"").content.split(b":")[0] for _ in range(10)}

        with ThreadPoolExecutor(4) as pool:
            per_thread = list(pool.map(calls, range(4)))
    assert all(len(numbers) == 1 for numbers in per_thread)  # one connection each
    assert len(set().union(*per_thread)) == 4 and handler.connections == 4


def test_headers_and_body_arrive_in_one_packet():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        body = b"b" * 5000
        sender = threading.Thread(
            target=_post_quietly, args=(url, body), daemon=True
        )  # no server answer: only what it sends is looked at
        sender.start()
        connection, _ = listener.accept()
        with connection:
            first = connection.recv(1 << 20)
    assert first.startswith(b"POST /risk HTTP/1.1\r\n") and first.endswith(b"\r\n\r\n" + body)


def _post_quietly(url: str, body: bytes) -> None:
    with httpx.Client(base_url=url, transport=KeepAliveTransport(), timeout=1.0) as http:
        try:
            http.post("/risk", content=body)
        except httpx.TransportError:
            pass


def test_the_default_and_httpcore_transports_give_the_same_answers(served, default_model):
    frame = window(11, default_model.schema.signals)
    with (
        RiskClient(served, token=TOKEN, timeout=30.0) as ours,
        RiskClient(served, token=TOKEN, timeout=30.0, transport=httpx.HTTPTransport()) as core,
    ):
        assert isinstance(ours._transport, KeepAliveTransport)
        assert ours.risk(frame) == core.risk(frame)
        assert ours.model_info() == core.model_info()


def test_a_server_that_closes_without_answering_is_service_unavailable():
    with socket.socket() as rude:  # reads the request, then hangs up
        rude.bind(("127.0.0.1", 0))
        rude.listen(4)
        port = rude.getsockname()[1]

        def hang_up() -> None:  # a new connection that fails is not tried again
            connection, _ = rude.accept()
            connection.recv(65536)
            connection.close()

        threading.Thread(target=hang_up, daemon=True).start()
        with RiskClient(f"http://127.0.0.1:{port}", timeout=5.0) as client:
            with pytest.raises(ServiceUnavailable, match="RemoteProtocolError"):
                client.model_info()
