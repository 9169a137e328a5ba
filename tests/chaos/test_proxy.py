"""The fault proxy's hold: a held request waits in the upstream's hands, one byte short, until
released; an upstream that dies meanwhile cuts it (a 502, counted); a hold that no request
took is withdrawn. Real sockets on loopback, no stack."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from tests.chaos.proxy import FaultProxy


class _Echo(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(201)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def echo() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _post_in_thread(url: str, body: bytes) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        response = httpx.post(f"{url}/v1/memories", content=body, timeout=20)
        out["status"], out["body"] = response.status_code, response.content

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_a_held_request_waits_one_byte_short_until_released(echo: int) -> None:
    body = b'{"content": "held until the test says so"}'
    with FaultProxy(echo, seed=1) as proxy:
        hold = proxy.hold_next()
        thread, out = _post_in_thread(proxy.url, body)
        assert hold.held.wait(5), "the request was never held"
        thread.join(0.3)
        assert thread.is_alive() and not out, "a held request was answered before its release"
        assert proxy.in_flight == 1
        proxy.release(hold)
        thread.join(5)
        assert out == {"status": 201, "body": body}
        assert proxy.in_flight == 0
        assert proxy.snapshot().get("upstream failed", 0) == 0


def test_an_upstream_dying_while_a_request_is_held_cuts_it() -> None:
    """Crash point: the upstream process dies holding the request's head and most of its
    body (as a web worker's SIGKILL does). End state: the client gets the proxy's 502 and
    the cut is counted as an upstream failure."""
    listener = socket.create_server(("127.0.0.1", 0))
    received: list[bytes] = []

    def accept_then_die() -> None:
        conn, _ = listener.accept()
        conn.settimeout(0.3)
        try:
            while chunk := conn.recv(65536):
                received.append(chunk)
        except TimeoutError:
            pass
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()  # a reset, as the kernel does for a killed process

    dying = threading.Thread(target=accept_then_die, daemon=True)
    dying.start()
    body = b'{"content": "cut in the worker"}'
    try:
        with FaultProxy(listener.getsockname()[1], seed=1) as proxy:
            hold = proxy.hold_next()
            thread, out = _post_in_thread(proxy.url, body)
            assert hold.held.wait(5)
            dying.join(5)
            proxy.release(hold)
            thread.join(5)
            assert out["status"] == 502
            assert proxy.snapshot()["upstream failed"] == 1
    finally:
        listener.close()
    sent = b"".join(received)
    assert sent.endswith(body[:-1]), "the upstream did not get the body one byte short"


def test_a_hold_no_request_took_is_withdrawn(echo: int) -> None:
    with FaultProxy(echo, seed=1) as proxy:
        hold = proxy.hold_next()
        proxy.release(hold)
        response = httpx.post(f"{proxy.url}/v1/memories", content=b"{}", timeout=5)
        assert response.status_code == 201
        assert not hold.held.is_set()
