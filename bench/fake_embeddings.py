"""A fake OpenAI-compatible embeddings server for tests and benchmarks.

It answers ``POST /v1/embeddings`` (and ``/embeddings``) in the OpenAI response shape:
``{"data": [{"index": i, "embedding": [...]}, ...], "model": ..., "usage": {...}}``. Each
vector is derived deterministically from the text's words (each word hashed into
``dimension`` signed buckets, then normalised), so texts sharing words are similar and the
same text always gets the same vector.

Knobs, settable as attributes at runtime:

- ``dimension``: the vectors' length (answering another length than the client expects is
  how a test makes a bad answer);
- ``latency_ms``: time to answer (a slow endpoint, past the client's timeout);
- ``down``: answer 503 to every request;
- ``api_key``: when set, requests without ``Authorization: Bearer <api_key>`` get 401.

Requests are counted (:attr:`FakeEmbeddings.requests`, and the texts in
:attr:`FakeEmbeddings.texts`); :meth:`reset` clears them. ``GET /stats`` returns them as JSON,
for processes other than the test's, and ``POST /reset`` clears them. Every request's headers
are kept (the last 100) in :attr:`FakeEmbeddings.headers`.

In-process::

    with FakeEmbeddings(dimension=32) as server:
        embedder = OpenAIEmbedder(server.base_url, "fake", 32)

As a process (the pipeline benchmark's)::

    python -m bench.fake_embeddings --port 8089 --dimension 256
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

EMBEDDING_PATHS = ("/v1/embeddings", "/embeddings")
_WORD = re.compile(r"[^\W_]+")


def fake_vector(text: str, dimension: int) -> list[float]:
    """The unit vector of ``text``: its words (lower-cased, a plural ``s`` dropped) hashed
    into signed buckets."""
    vector = [0.0] * dimension
    for word in _WORD.findall(text.casefold()):
        if len(word) > 3 and word.endswith("s"):
            word = word[:-1]
        digest = hashlib.sha256(word.encode()).digest()
        bucket = int.from_bytes(digest[:4], "big") % dimension
        vector[bucket] += 1.0 if digest[4] % 2 else -1.0
    norm = math.sqrt(sum(v * v for v in vector))
    if norm == 0:
        vector[0] = 1.0
        return vector
    return [v / norm for v in vector]


class FakeEmbeddings:
    def __init__(
        self,
        *,
        dimension: int = 32,
        latency_ms: int = 0,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
    ) -> None:
        self.dimension = dimension
        self.latency_ms = latency_ms
        self.down = False
        self.api_key = api_key
        self.host = host
        self.port = port
        self.requests = 0
        self.texts = 0
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> FakeEmbeddings:
        server = ThreadingHTTPServer((self.host, self.port), _handler_for(self))
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeEmbeddings:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def reset(self) -> None:
        with self._lock:
            self.requests = 0
            self.texts = 0
            self.headers.clear()

    def answer(self, body: Any, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.requests += 1
            self.headers = [*self.headers[-99:], headers]
        if self.latency_ms:
            time.sleep(self.latency_ms / 1000)
        if self.down:
            return 503, {"error": {"message": "down"}}
        if self.api_key and headers.get("authorization") != f"Bearer {self.api_key}":
            return 401, {"error": {"message": "bad key"}}
        texts = body.get("input") if isinstance(body, dict) else None
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            return 400, {"error": {"message": "input must be a string or a list of strings"}}
        with self._lock:
            self.texts += len(texts)
        data = [
            {"object": "embedding", "index": i, "embedding": fake_vector(t, self.dimension)}
            for i, t in enumerate(texts)
        ]
        return 200, {
            "object": "list",
            "data": data,
            "model": body.get("model"),
            "usage": {"prompt_tokens": sum(len(t.split()) for t in texts), "total_tokens": 0},
        }


def _handler_for(fake: FakeEmbeddings) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # Headers and body go out in two sends: without this the body waits for the
        # client's delayed ACK (about 40 ms on Linux loopback).
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/stats":
                self._send(200, {"requests": fake.requests, "texts": fake.texts})
            else:
                self._send(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if self.path == "/reset":
                fake.reset()
                self._send(200, {"requests": 0, "texts": 0})
                return
            if self.path not in EMBEDDING_PATHS:
                self._send(404, {"error": {"message": "not found"}})
                return
            try:
                body = json.loads(raw or b"null")
            except ValueError:
                self._send(400, {"error": {"message": "not JSON"}})
                return
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, payload = fake.answer(body, headers)
            try:
                self._send(status, payload)
            except (BrokenPipeError, ConnectionResetError):
                return  # the client gave up (its timeout)

    return Handler


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fake_embeddings", description="A fake embeddings endpoint"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dimension", type=int, default=256)
    parser.add_argument("--latency-ms", type=int, default=0)
    args = parser.parse_args(argv)
    server = FakeEmbeddings(
        dimension=args.dimension, latency_ms=args.latency_ms, host=args.host, port=args.port
    ).start()
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
