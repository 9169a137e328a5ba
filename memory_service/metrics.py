"""Prometheus metrics of the memory service, served at ``GET /metrics`` (no token).

gunicorn runs several worker processes, and a scrape reaches one of them. With
``PROMETHEUS_MULTIPROC_DIR`` set, every process writes its samples to its own files in that
directory (prometheus_client's multiprocess mode) and a scrape sums the files of all of them.
Without it, the process serves its own registry, which is right for a single process (tests,
``ibex demo``) and only a sample of the service under several workers.

Labels never carry tenant data: the route is the URI template (``/v1/memories/{memory_id:uuid}``,
never a path with an id in it) and no label holds an org, agent or key.

The series (docs/operations.md, "Metrics"):

- ``ibex_memory_http_requests_total{route, method, status}``
- ``ibex_memory_http_request_duration_seconds{route, method}`` (histogram)
- ``ibex_memory_idempotent_replays_total{source}``: ``redis`` (the stored response) or
  ``postgres`` (the row holding the key, when Redis had no record)
- ``ibex_memory_conflicts_total{code}``: ``IDEMPOTENCY_CONFLICT``,
  ``IDEMPOTENCY_IN_PROGRESS``, ``DUPLICATE_CONTENT``
- ``ibex_memory_idempotency_unavailable_total``: POSTs with a key run without Redis
- ``ibex_memory_near_duplicates_total``: POSTs refused as near-duplicates (trigram)
- ``ibex_memory_superseded_total``: memories marked superseded by a new memory
- ``ibex_memory_embeddings_failed_total``: memories stored without a vector because the
  embedder failed, or too many waited for one (the scheduler's backfill embeds them later)
- ``ibex_memory_search_semantic_unavailable_total``: searches and contexts answered lexically
  because the query could not be embedded
"""

from __future__ import annotations

import os
import time
from typing import Any

import falcon
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    values,
)
from prometheus_client.multiprocess import MultiProcessCollector

#: No route matched (404): one label value for every such path, so paths never become labels.
UNMATCHED = "(unmatched)"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
CONFLICT_CODES = ("IDEMPOTENCY_CONFLICT", "IDEMPOTENCY_IN_PROGRESS", "DUPLICATE_CONTENT")
REPLAY_SOURCES = ("redis", "postgres")


def _use_multiprocess_dir(directory: str) -> None:
    """Switch this process to prometheus_client's multiprocess values in ``directory``.

    prometheus_client picks its value class when it is imported and opens a process's files in
    the directory named by the environment, so the configured value is written there (the
    setting itself was read from the same variable by ``Settings.from_env``) and the value
    class is set for the process. gunicorn imports the app in each worker after the fork, so
    each worker writes files of its own pid.
    """
    os.makedirs(directory, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    if values.ValueClass is values.MutexValue:
        values.ValueClass = values.MultiProcessValue()


class Metrics:
    """The service's series and how a scrape renders them."""

    def __init__(self, multiprocess_dir: str | None = None) -> None:
        self.multiprocess_dir = multiprocess_dir
        if multiprocess_dir:
            _use_multiprocess_dir(multiprocess_dir)
            # Samples go to the files; a scrape reads them through a fresh collector.
            registry: CollectorRegistry | None = None
        else:
            registry = CollectorRegistry(auto_describe=True)
        self.registry = registry
        self.requests = Counter(
            "ibex_memory_http_requests_total",
            "HTTP requests answered, by route template, method and status.",
            ["route", "method", "status"],
            registry=registry,
        )
        self.duration = Histogram(
            "ibex_memory_http_request_duration_seconds",
            "Time from the request reaching the app to its response, by route and method.",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.replays = Counter(
            "ibex_memory_idempotent_replays_total",
            "POSTs answered with the stored response of their idempotency key, by where it was"
            " found: redis (the stored response) or postgres (the row holding the key).",
            ["source"],
            registry=registry,
        )
        self.conflicts = Counter(
            "ibex_memory_conflicts_total",
            "POSTs refused with 409, by error code.",
            ["code"],
            registry=registry,
        )
        # Facts that change (migration 000014): near-duplicates refused (also counted in
        # conflicts as DUPLICATE_CONTENT) and memories marked superseded by a write.
        self.near_duplicates = Counter(
            "ibex_memory_near_duplicates_total",
            "POSTs refused as near-duplicates of a current memory of their scope (trigram).",
            registry=registry,
        )
        # Semantic search (migration 000016).
        self.embeddings_failed = Counter(
            "ibex_memory_embeddings_failed_total",
            "Memories stored without a vector: the embedder failed, or too many waited.",
            registry=registry,
        )
        self.semantic_unavailable = Counter(
            "ibex_memory_search_semantic_unavailable_total",
            "Searches answered lexically: the query could not be embedded.",
            registry=registry,
        )
        self.supersessions = Counter(
            "ibex_memory_superseded_total",
            "Memories marked superseded by a new memory.",
            registry=registry,
        )
        self.idempotency_unavailable = Counter(
            "ibex_memory_idempotency_unavailable_total",
            "POSTs with an idempotency key that ran without Redis (Postgres keys alone).",
            registry=registry,
        )
        # Every code and source shows as 0 from the start, so a rate() has a series to work on.
        for code in CONFLICT_CODES:
            self.conflicts.labels(code)
        for source in REPLAY_SOURCES:
            self.replays.labels(source)

    def render(self) -> bytes:
        """The exposition text: this process's registry, or every process's files."""
        if self.multiprocess_dir:
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=self.multiprocess_dir)
            return generate_latest(registry)
        assert self.registry is not None
        return generate_latest(self.registry)


class RequestMetrics:
    """Falcon middleware, outermost: counts and times every request, errors included."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        req.context.metrics_started = time.perf_counter()

    def process_response(
        self, req: falcon.Request, resp: falcon.Response, resource: Any, req_succeeded: bool
    ) -> None:
        started = getattr(req.context, "metrics_started", None)
        route = req.uri_template or UNMATCHED
        method = req.method if req.method in falcon.COMBINED_METHODS else "OTHER"
        self.metrics.requests.labels(route, method, str(resp.status_code)).inc()
        if started is not None:
            self.metrics.duration.labels(route, method).observe(time.perf_counter() - started)


class MetricsResource:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = CONTENT_TYPE_LATEST
        resp.data = self.metrics.render()
