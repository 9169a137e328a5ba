"""A local OTLP/HTTP trace sink for the benchmarks: ``python -m bench.trace_sink --port N``.

Accepts ``POST /v1/traces`` (an ``ExportTraceServiceRequest``, protobuf), counts the requests
and the spans, and sums the spans' durations per span name (where a turn's time went: the LLM
call, the memory POSTs, each actor's delivery), and keeps nothing else; ``GET /stats``
answers them as JSON (``by_name``: each name's ``count`` and ``mean_ms``, a request's
client and server sides apart; ``gaps``: for each request seen from both sides, the mean time
from the client's start to the server's and from the server's end to the client's, i.e. what
the request spent outside the server's handler: sent, queued and read in the web process
before it, written and read back after it), ``GET /healthz``
200. Its CPU is reported apart from the pipeline's (``fake_trace_sink``), as the
fake LLM's is: a real collector runs elsewhere.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

#: A request's two sides are told apart by their kind (OTLP's Span.SpanKind: 2 server,
#: 3 client): the POST as the worker waited for it and as the web served it.
_SIDE = {2: " (server)", 3: " (client)"}
#: Request sides kept while their other side has not arrived (a request served by a process
#: that exports nothing is never matched).
_OPEN_LIMIT = 100_000


class Counts:
    def __init__(self) -> None:
        self.requests = 0
        self.spans = 0
        #: span name -> [count, total nanoseconds]
        self.durations: dict[str, list[int]] = {}
        #: A request's side seen so far, by the client span's id: (side, name, start, end).
        self.open: dict[bytes, tuple[int, str, int, int]] = {}
        #: span name -> [count, ns before the server's start, ns after the server's end]
        self.gaps: dict[str, list[int]] = {}
        self.lock = threading.Lock()

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        spans = [span for r in request.resource_spans for s in r.scope_spans for span in s.spans]
        with self.lock:
            self.requests += 1
            self.spans += len(spans)
            for span in spans:
                name = span.name + _SIDE.get(span.kind, "")
                total = self.durations.setdefault(name, [0, 0])
                total[0] += 1
                total[1] += max(0, span.end_time_unix_nano - span.start_time_unix_nano)
                if span.kind in _SIDE:
                    self._pair(span)

    def _pair(self, span: Any) -> None:
        """Match a request's client span with the server span that is its child."""
        key = span.span_id if span.kind == 3 else span.parent_span_id
        mine = (span.kind, span.name, span.start_time_unix_nano, span.end_time_unix_nano)
        other = self.open.pop(key, None)
        if other is None or other[0] == span.kind:
            if len(self.open) < _OPEN_LIMIT:
                self.open[key] = mine
            return
        client, server = (mine, other) if span.kind == 3 else (other, mine)
        gap = self.gaps.setdefault(client[1], [0, 0, 0])
        gap[0] += 1
        gap[1] += max(0, server[2] - client[2])
        gap[2] += max(0, client[3] - server[3])

    def stats(self) -> dict[str, Any]:
        with self.lock:
            by_name = {
                name: {"count": n, "mean_ms": round(ns / n / 1e6, 2)}
                for name, (n, ns) in sorted(self.durations.items())
            }
            gaps = {
                name: {
                    "count": n,
                    "before_server_ms": round(before / n / 1e6, 2),
                    "after_server_ms": round(after / n / 1e6, 2),
                }
                for name, (n, before, after) in sorted(self.gaps.items())
            }
            return {
                "requests": self.requests,
                "spans": self.spans,
                "by_name": by_name,
                "gaps": gaps,
            }


def make_server(port: int, counts: Counts) -> ThreadingHTTPServer:
    answer = ExportTraceServiceResponse().SerializeToString()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            counts.take(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            self._send(200, answer, "application/x-protobuf")

        def do_GET(self) -> None:
            if self.path == "/stats":
                self._send(200, json.dumps(counts.stats()).encode(), "application/json")
            else:
                self._send(200, b"ok", "text/plain")

        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trace_sink")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    server = make_server(args.port, Counts())
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
