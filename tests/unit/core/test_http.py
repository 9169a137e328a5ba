"""The cookieless HTTP clients: what one org's answer sets never rides on another's request."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from core.errors import ConfigError
from core.http import CookielessAsyncClient, CookielessClient, PlainHTTPTransport, endpoint_url
from extraction.memory_client import MemoryClient

SET_COOKIE = {"set-cookie": "__cf_bm=org-a-session; Path=/; HttpOnly"}


def recording(seen: list[str | None]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("cookie"))
        return httpx.Response(201, headers=SET_COOKIE, json={"id": str(uuid.uuid4())})

    return httpx.MockTransport(handler)


def test_a_plain_client_would_carry_the_cookie_to_the_next_request() -> None:
    # What the cookieless clients are for (and proof that the transport sets the cookie).
    seen: list[str | None] = []
    with httpx.Client(transport=recording(seen)) as client:
        client.get("http://llm.test/a")
        client.get("http://llm.test/b")
    assert seen == [None, "__cf_bm=org-a-session"]


def test_the_cookieless_client_neither_keeps_nor_sends_a_cookie() -> None:
    seen: list[str | None] = []
    with CookielessClient(transport=recording(seen)) as client:
        client.get("http://llm.test/a")
        client.post("http://llm.test/b", json={})
        assert dict(client.cookies) == {}
        client.cookies.set("sid", "x")
        client.cookies.update({"sid": "y"})
        client.cookies["sid"] = "z"
        client.get("http://llm.test/c")
    assert seen == [None, None, None]


def test_the_async_cookieless_client_neither_keeps_nor_sends_a_cookie() -> None:
    seen: list[str | None] = []

    async def run() -> None:
        transport = recording(seen)
        async with CookielessAsyncClient(transport=transport) as client:
            await client.get("http://llm.test/a")
            await client.get("http://llm.test/b")
            assert dict(client.cookies) == {}

    asyncio.run(run())
    assert seen == [None, None]


@pytest.mark.parametrize("kind", [CookielessClient, CookielessAsyncClient])
def test_a_cookieless_client_refuses_cookies_given_to_it(kind: type) -> None:
    with pytest.raises(ValueError, match="no cookies"):
        kind(cookies={"sid": "x"})


def test_the_pipelines_memory_client_sends_no_cookie_one_answer_set() -> None:
    seen: list[str | None] = []
    memory = MemoryClient("http://memory.test", "ibex_token", transport=recording(seen))
    with contextlib.closing(memory):
        for org in (uuid.uuid4(), uuid.uuid4()):
            assert memory.create_memory(org, {"content": "x"}, str(uuid.uuid4())).status == 201
    assert seen == [None, None]


# -- PlainHTTPTransport, against real sockets -----------------------------------------------


class Server:
    """A loopback HTTP/1.1 server that answers each request with ``answer(head, body)``
    (raw bytes; None: close without answering) and counts the connections it accepts."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.accepted = 0
        self.requests: list[bytes] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        buffered = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buffered:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffered += chunk
                head, _, buffered = buffered.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buffered) < length:
                    buffered += conn.recv(65536)
                body, buffered = buffered[:length], buffered[length:]
                self.requests.append(head + b"\r\n\r\n" + body)
                reply = self.answer(head, body)
                if reply is None:
                    return
                conn.sendall(reply)
                if b"connection: close" in reply.lower():
                    return

    def close(self) -> None:
        self.sock.close()


def reply(status: str, body: bytes, *headers: str) -> bytes:
    head = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


@contextlib.contextmanager
def server(answer: Any) -> Iterator[Server]:
    running = Server(answer)
    try:
        yield running
    finally:
        running.close()


def test_requests_go_whole_and_reuse_one_kept_alive_connection() -> None:
    def answer(head: bytes, body: bytes) -> bytes:
        return reply("201 Created", b'{"got": %d}' % len(body), "Content-Type: application/json")

    with server(answer) as srv, CookielessClient(base_url=srv.url, timeout=5) as client:
        assert isinstance(client._transport_for_url(httpx.URL(srv.url)), PlainHTTPTransport)
        for n in range(3):
            response = client.post("/v1/memories?x=1", json={"n": n}, headers={"X-Key": "k"})
            assert (response.status_code, response.json()) == (201, {"got": 7})
            assert response.reason_phrase == "Created" and response.http_version == "HTTP/1.1"
        assert client.get("/healthz").status_code == 201
    assert srv.accepted == 1
    first = srv.requests[0].decode()
    assert first.startswith("POST /v1/memories?x=1 HTTP/1.1\r\n")
    assert "x-key: k" in first.lower() and "content-length: 7" in first.lower()
    assert first.lower().count("host:") == 1 and first.endswith('{"n":0}')
    assert "content-length" not in srv.requests[-1].decode().lower()  # a GET has no body


def test_a_streamed_request_body_goes_with_its_length() -> None:
    echo = server(lambda head, body: reply("200 OK", body))
    with echo as srv, CookielessClient(base_url=srv.url, timeout=5) as client:
        answer = client.post("/echo", content=iter([b"ab", b"cd"]))
    assert answer.content == b"abcd"
    sent = srv.requests[0].decode().lower()
    assert "transfer-encoding" not in sent and "content-length: 4" in sent


def test_a_chunked_and_gzipped_answer_is_read_as_httpx_reads_it() -> None:
    packed = gzip.compress(b'{"ok": true}')
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(packed), packed)

    def answer(head: bytes, body: bytes) -> bytes:
        return (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Encoding: gzip\r\n"
            b"Content-Type: application/json\r\n\r\n" + chunked
        )

    with server(answer) as srv, CookielessClient(base_url=srv.url, timeout=5) as client:
        assert client.get("/").json() == {"ok": True}
        assert client.get("/").json() == {"ok": True}
    assert srv.accepted == 1


def test_a_connection_the_server_closed_while_idle_is_replaced() -> None:
    def answer(head: bytes, body: bytes) -> bytes:
        return reply("200 OK", b"{}", "Connection: keep-alive")

    with server(answer) as srv, CookielessClient(base_url=srv.url, timeout=5) as client:
        assert client.get("/a").status_code == 200
        # The kept-alive connection ends while idle (the server's keep-alive timeout): its
        # socket reads EOF, as after the server's FIN.
        transport = client._transport_for_url(httpx.URL(srv.url))
        assert isinstance(transport, PlainHTTPTransport)
        (idle,) = transport._idle[("127.0.0.1", srv.port)]
        assert idle.sock is not None
        idle.sock.shutdown(socket.SHUT_RD)
        assert client.get("/b").status_code == 200
    assert srv.accepted == 2


def test_an_answer_never_sent_is_a_remote_protocol_error() -> None:
    silent = server(lambda head, body: None)
    dropped = pytest.raises(httpx.RemoteProtocolError, match="without sending a response")
    with silent as srv, CookielessClient(base_url=srv.url, timeout=5) as client, dropped:
        client.post("/v1/memories", json={})


def test_a_slow_answer_is_a_read_timeout_and_a_closed_port_a_connect_error() -> None:
    def slow(head: bytes, body: bytes) -> bytes:
        time.sleep(1.0)
        return reply("200 OK", b"{}")

    timed_out = pytest.raises(httpx.ReadTimeout)
    with server(slow) as srv, CookielessClient(base_url=srv.url, timeout=0.2) as c, timed_out:
        c.get("/")
    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        port = spare.getsockname()[1]
    with CookielessClient(timeout=2) as client, pytest.raises(httpx.ConnectError):
        client.get(f"http://127.0.0.1:{port}/")


def test_https_and_proxied_http_keep_httpxs_own_transport(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with CookielessClient() as client:
        assert not isinstance(
            client._transport_for_url(httpx.URL("https://llm.test/")), PlainHTTPTransport
        )
    with pytest.raises(httpx.UnsupportedProtocol):
        PlainHTTPTransport().handle_request(httpx.Request("GET", "https://llm.test/"))
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.test:3128")
    with CookielessClient() as client:
        assert not isinstance(
            client._transport_for_url(httpx.URL("http://memory.test/")), PlainHTTPTransport
        )


def test_an_endpoint_is_parsed_once_and_a_bad_one_is_a_config_error_at_start() -> None:
    url = endpoint_url("http://llm.test:8080/v1/chat/completions", "LLM_BASE_URL")
    assert isinstance(url, httpx.URL) and url == "http://llm.test:8080/v1/chat/completions"
    with pytest.raises(ConfigError) as caught:
        endpoint_url("http://user:s3cret@llm.test:port/v1/chat/completions", "LLM_BASE_URL")
    assert caught.value.variable == "LLM_BASE_URL"
    assert "LLM_BASE_URL" in str(caught.value) and "s3cret" not in str(caught.value)
