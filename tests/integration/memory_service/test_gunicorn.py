"""The memory service as the Procfile ``web`` line runs it: a real gunicorn on a free loopback
port. What only the server sees: requests it cannot parse or that break its limits (answered in
the JSON error format, 4xx, never gunicorn's HTML page), and clients that stall mid-request
(they must not hold up health checks and writes), ``Expect: 100-continue`` and over-limit
bodies (answered by the event loop, never by a thread), and what the log may not repeat."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.stack.processes import ROOT, Launcher, free_port
from tests.integration.memory_service.helpers import Tenant, make_tenant, memory_body
from tests.integration.pipeline.helpers import wait_for

BIN = Path(sys.executable).parent
#: A short request deadline, so the test of it is quick; the default is 10 s.
REQUEST_TIMEOUT_SECONDS = 3


@dataclass(frozen=True)
class Web:
    port: int
    url: str
    log: Path


@pytest.fixture
def web(database_url: str, redis_url: str, tmp_path: Path) -> Iterator[Web]:
    """The Procfile web line with 2 workers x 2 threads: 4 threads in all."""
    port = free_port()
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "PORT": str(port),
        "WEB_CONCURRENCY": "2",
        "WEB_THREADS": "2",
        "MEMORY_MAX_BODY_BYTES": "4096",
        "WEB_REQUEST_TIMEOUT_SECONDS": str(REQUEST_TIMEOUT_SECONDS),
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    url = f"http://127.0.0.1:{port}"
    with Launcher(tmp_path, cwd=ROOT) as launcher:
        web = launcher.start_procfile("web", env, bind_host="127.0.0.1")
        launcher.wait_http(f"{url}/healthz", timeout=30)
        yield Web(port, url, web.log)


def _web_env(database_url: str, redis_url: str, port: int) -> dict[str, str]:
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "PORT": str(port),
        "WEB_CONCURRENCY": "1",
        "WEB_THREADS": "1",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    return env


@pytest.fixture
def acme(store: Any) -> Tenant:
    return make_tenant(store, "acme")


def _raw(web: Web, request: bytes, timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes, read the answer to its end (the server closes after an error)."""
    with socket.create_connection(("127.0.0.1", web.port), timeout=timeout) as sock:
        sock.sendall(request)
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
            head, sep, body = data.partition(b"\r\n\r\n")
            length = [
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ]
            if sep and length and len(body) >= length[0]:
                break
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    return int(lines[0].split()[1]), headers, body


BAD_REQUESTS = [
    # (what, raw request, expected status, expected code)
    ("request line too long", b"GET /healthz?" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
     414, "URI_TOO_LONG"),
    ("header too long", b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 9000 + b"\r\n\r\n",
     431, "HEADERS_TOO_LARGE"),
    ("too many headers", b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
     + b"".join(b"X-H%d: v\r\n" % i for i in range(150)) + b"\r\n", 431, "HEADERS_TOO_LARGE"),
    ("head over 64 KiB", b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
     + b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 8000) for i in range(9)) + b"\r\n",
     431, "HEADERS_TOO_LARGE"),
    ("control character in a header",
     b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Bad: a\x01b\r\n\r\n", 400, "BAD_REQUEST"),
    ("NUL in a header", b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Bad: a\x00b\r\n\r\n",
     400, "BAD_REQUEST"),
    ("space in a header name", b"GET /healthz HTTP/1.1\r\nHost: x\r\nX Bad: 1\r\n\r\n",
     400, "BAD_REQUEST"),
    ("garbage request line", b"\x16\x03\x01\x00 nonsense\r\n\r\n", 400, "BAD_REQUEST"),
    ("bad HTTP version", b"GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n", 400, "BAD_REQUEST"),
    ("bad Content-Length", b"POST /v1/memories HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
     400, "BAD_REQUEST"),
    ("two Content-Lengths",
     b"POST /v1/memories HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n{}",
     400, "BAD_REQUEST"),
]  # fmt: skip


def test_what_gunicorn_refuses_is_a_json_4xx(web: Web) -> None:
    """Every request gunicorn cannot parse, or that breaks a limit, gets the JSON error body
    and a 4xx (gunicorn alone would answer these with its HTML page, or 501)."""
    answers = {}
    for what, request_bytes, _, _ in BAD_REQUESTS:
        got, headers, body = _raw(web, request_bytes)
        content_type = headers.get("content-type")
        code = json.loads(body)["error"]["code"] if content_type == "application/json" else body
        answers[what] = (got, content_type, code)
    expected = {what: (status, "application/json", code) for what, _, status, code in BAD_REQUESTS}
    assert answers == expected
    assert "Invalid request from ip=127.0.0.1" in web.log.read_text()
    # The server is still serving.
    assert httpx.get(f"{web.url}/healthz", timeout=5).status_code == 200


def test_a_malformed_chunked_body_read_by_the_app_is_a_json_400(web: Web, acme: Tenant) -> None:
    """The chunk framing breaks inside a body the app is reading (authenticated, so it reads)."""
    head = (
        "POST /v1/memories HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {acme.writer}\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    for framing in (b"zz\r\n{}\r\n0\r\n\r\n", b"2\r\n{}XX0\r\n\r\n", b"2;\x01\r\n{}\r\n0\r\n\r\n"):
        got, headers, body = _raw(web, head + framing)
        assert (got, headers.get("content-type")) == (400, "application/json"), body
        assert json.loads(body)["error"]["code"] in {"BAD_REQUEST", "MALFORMED_JSON"}


def test_a_chunked_post_is_read_whole_and_stored(web: Web, acme: Tenant) -> None:
    """A chunked body in two pieces, with a pause between them, is buffered and served."""
    body = json.dumps(memory_body(acme.agent_id, "Sent in chunks.")).encode()
    half = len(body) // 2
    head = (
        "POST /v1/memories HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {acme.writer}\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", web.port), timeout=10) as sock:
        sock.sendall(head + b"%x\r\n%s\r\n" % (half, body[:half]))
        time.sleep(0.3)
        sock.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body) - half, body[half:]))
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 201"), answer


def _stall(web: Web, acme: Tenant, *, body: bool) -> socket.socket:
    """A client that sends part of a request and then nothing: its headers with a
    Content-Length and the first byte of the body, or only part of its headers."""
    sock = socket.create_connection(("127.0.0.1", web.port), timeout=10)
    if body:
        sock.sendall(
            (
                "POST /v1/memories HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Authorization: Bearer {acme.writer}\r\nContent-Length: 300\r\n\r\n{{"
            ).encode()
        )
    else:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    return sock


def _unaccepted(port: int) -> int:
    """Connections to ``port`` the server has not accepted yet: the accept queue of its
    listening socket (the receive queue of the LISTEN row in /proc/net/tcp)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, queues = fields[1], fields[3], fields[4]
        if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
            return int(queues.split(":")[1], 16)
    raise AssertionError(f"nothing listens on port {port}")


def test_stalled_clients_hold_up_no_one(web: Web, acme: Tenant) -> None:
    """12 clients stall mid-request (8 after their headers, with a body promised; 4 inside
    their headers), three times the 4 threads the server has. Health checks and POSTs on
    other connections keep answering quickly; the stalled connections stay open meanwhile
    (nothing was refused to make room)."""
    stalled = [_stall(web, acme, body=True) for _ in range(8)]
    stalled += [_stall(web, acme, body=False) for _ in range(4)]
    try:
        wait_for(lambda: _unaccepted(web.port) == 0, "the server to accept every stalled client")
        health: list[float] = []
        posts: list[float] = []
        with httpx.Client(base_url=web.url, timeout=5) as http:
            for i in range(10):
                started = time.monotonic()
                assert http.get("/healthz").status_code == 200
                health.append(time.monotonic() - started)
                started = time.monotonic()
                body = memory_body(acme.agent_id, f"Written past stalled clients {i}.")
                response = http.post("/v1/memories", json=body, headers=acme.headers())
                assert response.status_code == 201, response.text
                posts.append(time.monotonic() - started)
        # Unfixed, the first health check waits forever (it times out at 5 s); these bounds
        # leave a loaded 2-core machine plenty of room.
        assert max(health) < 1.0, health
        assert max(posts) < 2.0, posts
        for sock in stalled:  # still open: not one byte answered yet
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):
                sock.recv(1)
    finally:
        for sock in stalled:
            sock.close()


def test_a_stalled_request_is_answered_408_then_closed(web: Web, acme: Tenant) -> None:
    sock = _stall(web, acme, body=True)
    with sock:
        started = time.monotonic()
        sock.settimeout(REQUEST_TIMEOUT_SECONDS + 5)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        waited = time.monotonic() - started
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer
    assert json.loads(body)["error"]["code"] == "REQUEST_TIMEOUT"
    assert REQUEST_TIMEOUT_SECONDS - 0.5 < waited < REQUEST_TIMEOUT_SECONDS + 2.5, waited


def test_kept_alive_connections_serve_one_request_after_another(web: Web, acme: Tenant) -> None:
    """The buffering path for a kept-alive connection's next request, and an unread body."""
    with httpx.Client(base_url=web.url, timeout=5) as http:
        for i in range(3):
            body = memory_body(acme.agent_id, f"Kept alive {i}.")
            assert http.post("/v1/memories", json=body, headers=acme.headers()).status_code == 201
            # A body the app refuses without reading it (over the limit) leaves it unread.
            big = memory_body(acme.agent_id, "x" * 5000)
            refused = http.post("/v1/memories", json=big, headers=acme.headers())
            assert refused.status_code == 413
            assert refused.json()["error"]["code"] == "BODY_TOO_LARGE"
        listed = http.get("/v1/memories", headers=acme.headers(), params={"limit": "10"})
        assert len(listed.json()["items"]) == 3
    assert uuid.UUID(listed.json()["items"][0]["id"])


def _recv_until_closed(sock: socket.socket, timeout: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and how long that took."""
    started = time.monotonic()
    sock.settimeout(timeout)
    answer = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            answer += chunk
    return answer, time.monotonic() - started


def _expecting(web: Web, token: str, length: int = 300) -> socket.socket:
    """A client that sends a head with ``Expect: 100-continue`` and waits for 100 Continue."""
    sock = socket.create_connection(("127.0.0.1", web.port), timeout=10)
    sock.sendall(
        (
            "POST /v1/memories HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {token}\r\nContent-Length: {length}\r\n"
            "Expect: 100-continue\r\n\r\n"
        ).encode()
    )
    return sock


def _oversized(web: Web) -> socket.socket:
    """A client without a token that announces a body over the limit, sends part of it, and
    then nothing."""
    sock = socket.create_connection(("127.0.0.1", web.port), timeout=10)
    sock.sendall(
        b"POST /v1/memories HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000000\r\n\r\n" + b"x" * 1000
    )
    return sock


def test_held_continue_and_oversized_requests_hold_up_no_one(web: Web, acme: Tenant) -> None:
    """16 clients hold an ``Expect: 100-continue`` request (a read-only token is enough to
    get that far) and 16 send over-limit bodies without a token, at once: 8 times the 4
    threads. Each expecting client gets its 100 Continue from the event loop and, its body
    never sent, its 408 after the request deadline; each oversized one its 413 with
    ``Connection: close`` at once. Health checks and POSTs on other connections keep
    answering quickly meanwhile."""
    started = time.monotonic()
    expecting = [_expecting(web, acme.reader) for _ in range(16)]
    oversized = [_oversized(web) for _ in range(16)]
    try:
        for sock in expecting:
            sock.settimeout(5)
            assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        for sock in oversized:
            answer, waited = _recv_until_closed(sock, 5)
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 413"), answer
            assert b"\r\nConnection: close\r\n" in head + b"\r\n"
            assert json.loads(body)["error"]["code"] == "BODY_TOO_LARGE"
            assert waited < 2.0, waited
        health: list[float] = []
        posts: list[float] = []
        with httpx.Client(base_url=web.url, timeout=5) as http:
            for i in range(5):
                begun = time.monotonic()
                assert http.get("/healthz").status_code == 200
                health.append(time.monotonic() - begun)
                begun = time.monotonic()
                body = memory_body(acme.agent_id, f"Written past held clients {i}.")
                response = http.post("/v1/memories", json=body, headers=acme.headers())
                assert response.status_code == 201, response.text
                posts.append(time.monotonic() - begun)
        assert max(health) < 1.0, health
        assert max(posts) < 2.0, posts
        for sock in expecting:
            answer, _ = _recv_until_closed(sock, REQUEST_TIMEOUT_SECONDS + 5)
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408"), answer
            assert json.loads(body)["error"]["code"] == "REQUEST_TIMEOUT"
        waited = time.monotonic() - started
        assert REQUEST_TIMEOUT_SECONDS - 0.5 < waited < REQUEST_TIMEOUT_SECONDS + 2.5, waited
    finally:
        for sock in expecting + oversized:
            sock.close()


def test_a_continued_request_is_served_after_one_100_continue(web: Web, acme: Tenant) -> None:
    body = json.dumps(memory_body(acme.agent_id, "Sent after 100 Continue.")).encode()
    with _expecting(web, acme.writer, len(body)) as sock:
        assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        answer = sock.recv(65536)
    # The one 100 Continue came from the event loop: gunicorn sends no second one.
    assert answer.startswith(b"HTTP/1.1 201"), answer


def test_an_oversized_expecting_or_chunked_body_is_413_without_100_continue(web: Web) -> None:
    """No 100 Continue for a body that will be refused; chunks adding up past the limit are
    refused as soon as they do."""
    expecting = (
        b"POST /v1/memories HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n"
        b"Expect: 100-continue\r\n\r\n"
    )
    chunked = (
        b"POST /v1/memories HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"900\r\n"
        + b"x" * 0x900
        + b"\r\n"
        + b"900\r\n"
        + b"x" * 0x900
        + b"\r\n"
    )
    for request in (expecting, chunked):
        with socket.create_connection(("127.0.0.1", web.port), timeout=10) as sock:
            sock.sendall(request)
            answer, waited = _recv_until_closed(sock, 5)
        assert answer.startswith(b"HTTP/1.1 413"), answer
        assert waited < 2.0


def test_a_malformed_header_never_puts_its_value_in_the_log_or_the_answer(
    web: Web, acme: Tenant
) -> None:
    """A header line without its colon, or a bad name or value, is a 400 that names no value:
    the token it carries appears in no log line and not in the answer."""
    token = acme.writer
    lines = [
        f"Authorization Bearer {token}",  # the colon forgotten
        token,  # a line that is only the token
        f"Authorization Bearer {token}: x",  # a bad name
        f"Authorization: Bearer {token}\x01",  # a control character in the value
        f"Authorization: Bearer\r\n {token}",  # obsolete folding
    ]
    for line in lines:
        request = f"GET /v1/memories HTTP/1.1\r\nHost: x\r\n{line}\r\n\r\n".encode("latin-1")
        status, _, body = _raw(web, request)
        assert status == 400, body
        assert token.encode() not in body
        assert token[:12].encode() not in body
    log = web.log.read_text()
    assert "Invalid request from ip=127.0.0.1" in log
    assert token not in log
    assert token[:12] not in log  # not even its prefix and first characters


def test_two_web_processes_start_on_one_host(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    """The Procfile line shares no control socket (gunicorn's default is one path per user):
    a second web process on the same host, same user and same HOME starts and serves."""
    ports = [free_port(), free_port()]
    with Launcher(tmp_path, cwd=ROOT) as launcher:
        for i, port in enumerate(ports):
            env = _web_env(database_url, redis_url, port)
            launcher.start_procfile("web", env, name=f"web{i}", bind_host="127.0.0.1")
        for port in ports:
            launcher.wait_http(f"http://127.0.0.1:{port}/healthz", timeout=30)
            assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200


def test_a_pipelined_request_read_ahead_is_buffered_again(web: Web) -> None:
    """A client sends a whole request and the start of the next in one write: the first is
    answered, and the rest of the second, sent later, is read by the event loop (a thread
    never waits for it), then answered too."""
    first = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", web.port), timeout=10) as sock:
        sock.sendall(first + b"GET /healthz HTTP/1.1\r\nHo")
        time.sleep(0.5)
        assert httpx.get(f"{web.url}/healthz", timeout=5).status_code == 200
        sock.sendall(b"st: x\r\nConnection: close\r\n\r\n")
        answer, _ = _recv_until_closed(sock, 5)
    assert answer.count(b"HTTP/1.1 200") == 2, answer


def test_a_kept_alive_connections_next_request_sent_in_parts_is_read_whole(web: Web) -> None:
    """The next request on a kept-alive connection, read as soon as it is readable, arrives
    in three writes with pauses between them: the event loop keeps reading (no thread waits
    for it, another client is served meanwhile), then it is answered."""
    with socket.create_connection(("127.0.0.1", web.port), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        while b"\r\n\r\n" not in first or not first.rstrip().endswith(b"}"):
            first += sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200"), first
        for part in (b"GET /healthz HT", b"TP/1.1\r\nHost: x\r\n", b"Connection: close\r\n\r\n"):
            sock.sendall(part)
            time.sleep(0.3)
            assert httpx.get(f"{web.url}/healthz", timeout=5).status_code == 200
        answer, _ = _recv_until_closed(sock, 5)
    assert answer.startswith(b"HTTP/1.1 200") and answer.count(b"HTTP/1.1") == 1, answer
