"""Spans recorded in memory, and a search of every string a span carries."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from core import tracing


@contextmanager
def recorded_spans(service: str = "ibex-test") -> Iterator[InMemorySpanExporter]:
    """Traces on in this process, every span exported at once into memory; off afterwards."""
    exporter = InMemorySpanExporter()
    tracing.install([SimpleSpanProcessor(exporter)], service)
    try:
        yield exporter
    finally:
        tracing.uninstall()


def every_text(span: Any) -> Iterator[str]:
    """Every string a span carries: its name, status, attributes, events and links."""
    yield span.name
    yield span.status.description or ""
    for key, value in (span.attributes or {}).items():
        yield f"{key}={value}"
    for event in span.events:
        yield event.name
        for key, value in (event.attributes or {}).items():
            yield f"{key}={value}"
    for link in span.links:
        for key, value in (link.attributes or {}).items():
            yield f"{key}={value}"


def by_name(spans: Any, name: str) -> list[Any]:
    return [s for s in spans if s.name == name]
