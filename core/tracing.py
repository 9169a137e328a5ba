"""OpenTelemetry traces: off unless the standard ``OTEL_*`` variables ask for them.

Traces are on in a process when :func:`setup` ran there and :func:`wanted` said yes:
``OTEL_TRACES_EXPORTER`` names ``otlp`` or ``console``, or (the exporter unset)
``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set; never with
``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``. Each process names itself
(``ibex-web``, ``ibex-worker``, ``ibex-scheduler``, ``ibex-proxy``) unless
``OTEL_SERVICE_NAME`` says otherwise; the exporter (OTLP over HTTP) and the batch processor read
their own standard variables (``OTEL_EXPORTER_OTLP_*``, ``OTEL_BSP_*``).

Off, nothing here imports OpenTelemetry (the optional ``tracing`` extra) and every helper is a
check of one module global: :func:`span` hands back one shared no-op context manager,
:func:`inject` leaves the carrier alone.

The context crosses processes as W3C trace context (``traceparent``, ``tracestate``): in HTTP
headers and in a queued message's options. Spans carry identities, counts, names of models and
routes, and status codes; never conversation or memory text. A failure is recorded as its
exception's class only (``error.type``): an exception's message may quote a payload.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, TypeVar

log = logging.getLogger(__name__)

C = TypeVar("C", bound=MutableMapping[str, Any])

#: The trace exporters :func:`setup` knows (``OTEL_TRACES_EXPORTER``, comma separated).
EXPORTERS = ("otlp", "console")
#: The W3C trace context fields: HTTP headers and message options of the same names.
TRACE_FIELDS = ("traceparent", "tracestate")
#: The instrumentation scope of every span of ours.
SCOPE = "ibex"
#: The HTTP methods a server span names; any other is ``_OTHER`` (the HTTP conventions).
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def http_method(method: str) -> str:
    """``method`` as a span names it: one of :data:`HTTP_METHODS`, else ``_OTHER``."""
    return method if method in HTTP_METHODS else "_OTHER"


_NOOP: contextlib.nullcontext[None] = contextlib.nullcontext()
_lock = threading.Lock()
_tracer: Any = None
_provider: Any = None
_propagator: Any = None


def wanted(env: Mapping[str, str] | None = None) -> bool:
    """Whether the ``OTEL_*`` variables (``env``, else this process's) ask for traces."""
    if env is None:
        from core.config import otel_environment

        env = otel_environment()
    if (env.get("OTEL_SDK_DISABLED") or "").strip().lower() == "true":
        return False
    named = _exporter_names(env)
    if named:
        return any(name in EXPORTERS for name in named)
    return bool(
        (env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "").strip()
        or (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or "").strip()
    )


def _exporter_names(env: Mapping[str, str]) -> list[str]:
    raw = env.get("OTEL_TRACES_EXPORTER") or ""
    return [name.strip().lower() for name in raw.split(",") if name.strip()]


def enabled() -> bool:
    """Whether this process records spans."""
    return _tracer is not None


def setup(service_name: str, env: Mapping[str, str] | None = None) -> bool:
    """Turn traces on in this process when the variables ask for them; whether they are on.

    ``service_name`` is the process's ``service.name`` unless ``OTEL_SERVICE_NAME`` is set.
    Idempotent: a second call keeps the first set-up. Without the ``tracing`` extra installed
    it logs one warning and leaves traces off."""
    if env is None:
        from core.config import otel_environment

        env = otel_environment()
    if _tracer is not None or not wanted(env):
        return _tracer is not None
    try:
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
    except ImportError:
        log.warning("OTEL_* asks for traces but the tracing extra is not installed: traces off")
        return False
    exporters: list[SpanExporter] = []
    for name in _exporter_names(env) or ["otlp"]:
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter())
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporters.append(ConsoleSpanExporter())
    processors = [BatchSpanProcessor(exporter) for exporter in exporters]
    return install(processors, service_name, env=env, make_global=True)


def install(
    processors: list[Any],
    service_name: str,
    *,
    env: Mapping[str, str] | None = None,
    make_global: bool = False,
) -> bool:
    """Record spans through ``processors`` (span processors of the SDK) from now on: what
    :func:`setup` does with the exporters the variables name; tests pass a processor of an
    in-memory exporter."""
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    global _tracer, _provider, _propagator
    attributes: dict[str, str] = {}
    if not ((env or {}).get("OTEL_SERVICE_NAME") or "").strip():
        attributes["service.name"] = service_name
    provider = TracerProvider(resource=Resource.create(attributes))
    for processor in processors:
        provider.add_span_processor(processor)
    with _lock:
        _provider = provider
        _propagator = TraceContextTextMapPropagator()
        _tracer = provider.get_tracer(SCOPE)
    if make_global:
        trace.set_tracer_provider(provider)
    return True


def uninstall() -> None:
    """Traces off again, the recorded spans flushed (tests; a process's end)."""
    global _tracer, _provider, _propagator
    with _lock:
        provider, _provider, _tracer, _propagator = _provider, None, None, None
    if provider is not None:
        provider.shutdown()


def flush(timeout_millis: int = 5000) -> None:
    """Export the spans recorded so far (before a process exits)."""
    if _provider is not None:
        _provider.force_flush(timeout_millis)


def _kind(kind: str) -> Any:
    from opentelemetry.trace import SpanKind

    return getattr(SpanKind, kind.upper())


def parent_of(carrier: Mapping[str, Any] | None) -> Any:
    """The context a carrier (headers, message options) holds, or None (traces off, or no
    valid ``traceparent`` in it)."""
    if _propagator is None or not carrier:
        return None
    fields = {name: value for name in TRACE_FIELDS if isinstance(value := carrier.get(name), str)}
    if "traceparent" not in fields:
        return None
    return _propagator.extract(fields)


def root() -> Any:
    """An empty context: a span begun with it as ``parent`` starts a trace of its own."""
    if _tracer is None:
        return None
    from opentelemetry.context import Context

    return Context()


def inject(carrier: C) -> C:
    """Put the current span's ``traceparent`` (and ``tracestate``) into ``carrier``; return it.
    Nothing when traces are off or no span is current."""
    if _propagator is not None:
        _propagator.inject(carrier)
    return carrier


@contextlib.contextmanager
def _span(
    name: str, kind: str, attributes: Mapping[str, Any] | None, parent: Any, links: Any
) -> Iterator[Any]:

    with _tracer.start_as_current_span(
        name,
        context=parent,
        kind=_kind(kind),
        attributes=clean(attributes),
        links=links,
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        try:
            yield current
        except BaseException as exc:
            failed(current, exc)
            raise


def span(
    name: str,
    *,
    kind: str = "internal",
    attributes: Mapping[str, Any] | None = None,
    parent: Any = None,
    links: Any = None,
) -> contextlib.AbstractContextManager[Any]:
    """A span around a block, current inside it; yields the span, or None when traces are off.
    ``kind``: internal, server, client, producer or consumer; ``parent``: a context from
    :func:`parent_of` (default: the current one)."""
    if _tracer is None:
        return _NOOP
    return _span(name, kind, attributes, parent, links)


class Running:
    """A span begun by :func:`begin` and current until :meth:`end` (hooks that open a span
    in one call and close it in another: a queue's middleware, a web framework's)."""

    def __init__(self, span: Any, token: Any) -> None:
        self.span = span
        self._token = token

    def end(self, exc: BaseException | None = None) -> None:
        from opentelemetry import context

        try:
            if exc is not None:
                failed(self.span, exc)
            self.span.end()
        finally:
            context.detach(self._token)


def begin(
    name: str,
    *,
    kind: str = "internal",
    attributes: Mapping[str, Any] | None = None,
    parent: Any = None,
    links: Any = None,
) -> Running | None:
    """Start a span and make it current until its :meth:`Running.end`; None when off."""
    if _tracer is None:
        return None
    from opentelemetry import context, trace

    started = _tracer.start_span(
        name, context=parent, kind=_kind(kind), attributes=clean(attributes), links=links
    )
    return Running(started, context.attach(trace.set_span_in_context(started)))


def current_link() -> list[Any]:
    """A link to the current span (a trace started from inside another one), or none."""
    if _tracer is None:
        return []
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return [trace.Link(context)] if context.is_valid else []


def has_current() -> bool:
    """Whether a recording span of ours is current."""
    if _tracer is None:
        return False
    from opentelemetry import trace

    return bool(trace.get_current_span().get_span_context().is_valid)


def failed(span: Any, exc: BaseException) -> None:
    """Mark ``span`` failed by ``exc``'s class (never its message: it may quote a payload)."""
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("error.type", type(exc).__name__)
    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))


def clean(attributes: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``attributes`` without the None values (unknown ids), UUIDs as text."""
    if not attributes:
        return None
    out: dict[str, Any] = {}
    for key, value in attributes.items():
        if value is None:
            continue
        out[key] = value if isinstance(value, bool | int | float | str) else str(value)
    return out


__all__ = [
    "EXPORTERS",
    "HTTP_METHODS",
    "TRACE_FIELDS",
    "Running",
    "begin",
    "clean",
    "current_link",
    "enabled",
    "failed",
    "flush",
    "has_current",
    "http_method",
    "inject",
    "install",
    "parent_of",
    "root",
    "setup",
    "span",
    "uninstall",
    "wanted",
]
