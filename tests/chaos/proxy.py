"""A fault-injecting HTTP proxy between the workers and the memory service (loopback only).

Every request is forwarded to the upstream (gunicorn) unless a seeded coin says otherwise. For
requests that match (``POST /v1/memories`` by default) two faults are injected:

- **reject**: answer ``503`` before forwarding (the memory service never saw the request);
- **drop after commit**: forward, read the upstream's whole response (the memory is committed
  in Postgres by then), then lose the answer: close the connection without a byte, or answer
  ``502``, alternately. The client cannot tell this from a failure before the commit, retries,
  and must end with one memory.

A test can also hold one request in the upstream's hands (:meth:`FaultProxy.hold_next`): the
next matching request is forwarded with its body one byte short, so that a web worker has
accepted it and waits for the rest, until the test releases it; a web worker killed meanwhile
cuts it for certain.

Counters (:attr:`FaultProxy.stats`), the requests forwarded and not answered yet
(:attr:`FaultProxy.in_flight`: what a web worker's death can cut) and the idempotency keys
whose response was dropped after a ``2xx`` (:attr:`FaultProxy.dropped_keys`) let a test check
what it injected.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "host",
        "content-length",
    }
)
UPSTREAM_TIMEOUT_S = 30.0
#: The longest a held request waits for its release before the proxy sends the rest itself.
HOLD_LIMIT_S = 15.0


class Hold:
    """One request held by the proxy: ``held`` is set once its head and all of its body but
    the last byte are sent upstream; ``release`` lets the proxy send that byte."""

    def __init__(self) -> None:
        self.held = threading.Event()
        self.release = threading.Event()


class FaultProxy:
    """A threaded reverse proxy to ``upstream_port`` with seeded faults; a context manager."""

    def __init__(
        self,
        upstream_port: int,
        *,
        seed: int,
        reject_rate: float = 0.0,
        drop_rate: float = 0.0,
        method: str = "POST",
        path: str = "/v1/memories",
    ) -> None:
        self.upstream_port = upstream_port
        self.reject_rate = reject_rate
        self.drop_rate = drop_rate
        self.method = method
        self.path = path
        self.stats: Counter[str] = Counter()
        self.in_flight = 0  # requests forwarded upstream and not answered yet
        self.dropped_keys: list[str] = []
        self._hold: Hold | None = None
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- lifetime ---------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        server = _Server(("127.0.0.1", 0), _handler_for(self))
        server.proxy = self
        server.daemon_threads = True
        self._server = server
        self.port = int(server.server_address[1])
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            daemon=True,
            name=f"fault-proxy:{self.port}",
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- decisions and counters --------------------------------------------------------------

    def configure(
        self, *, reject_rate: float | None = None, drop_rate: float | None = None
    ) -> None:
        with self._lock:
            if reject_rate is not None:
                self.reject_rate = reject_rate
            if drop_rate is not None:
                self.drop_rate = drop_rate

    def decide(self, method: str, path: str) -> str:
        """``reject``, ``drop`` or ``forward`` for one request (seeded, thread-safe)."""
        if not self._matches(method, path):
            return "forward"
        with self._lock:
            roll = self._random.random()
            if roll < self.reject_rate:
                return "reject"
            if roll < self.reject_rate + self.drop_rate:
                return "drop"
        return "forward"

    def _matches(self, method: str, path: str) -> bool:
        return method == self.method and path.split("?", 1)[0].rstrip("/") == self.path

    def hold_next(self) -> Hold:
        """Hold the next matching request (see the module's docstring); release it with
        :meth:`release`, whether or not a request was held."""
        hold = Hold()
        with self._lock:
            self._hold = hold
        return hold

    def release(self, hold: Hold) -> None:
        """Let a held request finish; a hold no request took yet is withdrawn."""
        with self._lock:
            if self._hold is hold:
                self._hold = None
        hold.release.set()

    def take_hold(self, method: str, path: str) -> Hold | None:
        """The pending hold, for the handler of a matching request (taken once)."""
        if not self._matches(method, path):
            return None
        with self._lock:
            hold, self._hold = self._hold, None
        return hold

    def count(self, name: str, key: str | None = None) -> int:
        """Add one to ``name``; returns the new count. ``key`` is kept when a 2xx was lost."""
        with self._lock:
            self.stats[name] += 1
            if key is not None:
                self.dropped_keys.append(key)
            return self.stats[name]

    def flight(self, step: int) -> None:
        with self._lock:
            self.in_flight += step

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.stats)


class _Server(ThreadingHTTPServer):
    proxy: FaultProxy

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A killed worker resets its connections: count it instead of printing a traceback.
        self.proxy.count("client connection reset")


def _handler_for(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as httpx expects from the real service
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _reply(self, status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _error(self, status: int, code: str, message: str) -> None:
            body = json.dumps({"error": {"code": code, "message": message}}).encode()
            self._reply(status, body, [("Content-Type", "application/json")])

        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            decision = proxy.decide(self.command, self.path)
            proxy.count(f"requests {self.command}")
            if decision == "reject":
                proxy.count("rejected 503 before forwarding")
                self._error(503, "CHAOS_UNAVAILABLE", "injected: the proxy refused to forward")
                return
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            upstream = http.client.HTTPConnection(
                "127.0.0.1", proxy.upstream_port, timeout=UPSTREAM_TIMEOUT_S
            )
            hold = proxy.take_hold(self.command, self.path) if body else None
            proxy.flight(+1)
            try:
                if hold is None:
                    upstream.request(self.command, self.path, body=body, headers=headers)
                else:
                    _send_held(upstream, self.command, self.path, body, headers, hold)
                response = upstream.getresponse()
                data = response.read()
                status = response.status
                reply_headers = [
                    (k, v) for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP
                ]
            except (OSError, http.client.HTTPException) as exc:
                proxy.count("upstream failed")
                self._error(502, "CHAOS_UPSTREAM", f"upstream failed: {type(exc).__name__}")
                return
            finally:
                proxy.flight(-1)
                upstream.close()
            proxy.count(f"upstream {status}")
            if decision == "drop":
                key = self.headers.get("X-Idempotency-Key")
                committed = 200 <= status < 300
                n = proxy.count(
                    "dropped after commit" if committed else "dropped (not committed)",
                    key if committed else None,
                )
                if n % 2:
                    # The connection goes down without a byte of the answer.
                    self.close_connection = True
                    return
                self._error(502, "CHAOS_LOST", "injected: the upstream answer was lost")
                return
            self._reply(status, data, reply_headers)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

    return Handler


def _send_held(
    upstream: http.client.HTTPConnection,
    method: str,
    path: str,
    body: bytes,
    headers: dict[str, str],
    hold: Hold,
) -> None:
    """Send the request with its body one byte short, wait for the release, send the byte."""
    upstream.putrequest(method, path, skip_accept_encoding=True)
    for name, value in headers.items():
        upstream.putheader(name, value)
    upstream.putheader("Content-Length", str(len(body)))
    upstream.endheaders()
    upstream.send(body[:-1])
    hold.held.set()
    hold.release.wait(HOLD_LIMIT_S)
    upstream.send(body[-1:])


__all__ = ["FaultProxy", "Hold"]
