"""The trace sink pairs a request's client span with its server span (the server span's
parent) in either order of arrival, and reports the time outside the server's handler."""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from bench.trace_sink import Counts

MS = 1_000_000


def _export(*spans: Span) -> bytes:
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    scope.spans.extend(spans)
    return request.SerializeToString()


def _span(kind: int, span_id: bytes, parent: bytes, start_ms: int, end_ms: int) -> Span:
    return Span(
        name="POST /v1/memories",
        kind=kind,
        span_id=span_id,
        parent_span_id=parent,
        start_time_unix_nano=start_ms * MS,
        end_time_unix_nano=end_ms * MS,
    )


def test_a_request_seen_from_both_sides_gives_its_time_before_and_after_the_server() -> None:
    counts = Counts()
    # One request whose server span arrives first, one whose client span does.
    counts.take(_export(_span(2, b"s1______", b"c1______", 10, 20)))
    counts.take(_export(_span(3, b"c1______", b"", 0, 30), _span(3, b"c2______", b"", 100, 110)))
    counts.take(_export(_span(2, b"s2______", b"c2______", 104, 108)))
    # A client span whose server side never comes is not paired.
    counts.take(_export(_span(3, b"c3______", b"", 200, 210)))
    stats = counts.stats()
    assert stats["gaps"]["POST /v1/memories"] == {
        "count": 2,
        "before_server_ms": 7.0,  # (10 + 4) / 2
        "after_server_ms": 6.0,  # (10 + 2) / 2
    }
    assert stats["by_name"]["POST /v1/memories (client)"]["count"] == 3
