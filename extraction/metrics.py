"""Pipeline metrics: what the stages count, behind a small interface.

:class:`PipelineMetrics` does nothing; the worker installs :class:`PrometheusMetrics` when
``METRICS_PORT`` is set, beside Dramatiq's own Prometheus middleware, which serves every
worker process's series (prometheus_client's multiprocess mode) on that port. prometheus_client
is imported only on first use, after Dramatiq has pointed it at the shared directory.

Series (all prefixed ``ibex_``):

=================================  =======  ==================================================
``llm_calls_total``                counter  LLM calls by ``provider`` and ``result`` (ok/error)
``llm_tokens_total``               counter  tokens by ``kind`` (prompt/completion)
``write_outcomes_total``           counter  write outcomes by HTTP ``status`` and ``code``
``turns_done_total``               counter  turns marked done
``repeated_turns_total``           counter  turns whose LLM input matched a persisted result
                                            (reused: no LLM call)
``unknown_refs_total``             counter  ``replaces`` refs the answer named that the prompt
                                            did not list (dropped)
``supersedes_total``               counter  supersedes resolved from refs and persisted
``backlog_turns``                  gauge    unextracted turns by ``state`` (at the last scan)
``backlog_sessions``               gauge    sessions with unextracted turns (last scan)
``dead_letters``                   gauge    open dead letters by ``queue`` (last scan)
=================================  =======  ==================================================
"""

from __future__ import annotations

import threading
from typing import Any


class PipelineMetrics:
    """Counts nothing. The interface the stages call."""

    def llm_call(
        self, provider: str, *, ok: bool, prompt_tokens: int = 0, completion_tokens: int = 0
    ) -> None:
        """One LLM call finished."""

    def memory_write(self, status: int | None, code: str | None) -> None:
        """One POST to the memory service answered (``status`` None: no answer)."""

    def turn_done(self) -> None:
        """A turn became done."""

    def repeated_turn(self) -> None:
        """A turn reused the result persisted for an identical input: no LLM call."""

    def embedding_request(self, *, ok: bool, texts: int = 0) -> None:
        """One request to the embedder for a turn's memories (``texts`` of them)."""

    def refs(self, *, resolved: int, unknown: int) -> None:
        """An answer's ``replaces`` refs: resolved to memory ids, or unknown and dropped."""

    def backlog(self, status: Any) -> None:
        """The backlog as :func:`extraction.status.collect` reported it."""


class PrometheusMetrics(PipelineMetrics):
    """The series above, created on first use in each process."""

    # One set of series per process, however many instances: prometheus_client refuses to
    # register a name twice.
    _lock = threading.Lock()
    _series: dict[str, Any] | None = None

    def _metrics(self) -> dict[str, Any]:
        cls = PrometheusMetrics
        if cls._series is None:
            with cls._lock:
                if cls._series is None:
                    cls._series = self._create()
        return cls._series

    @staticmethod
    def _create() -> dict[str, Any]:
        import prometheus_client as prom

        return {
            "llm_calls": prom.Counter("ibex_llm_calls_total", "LLM calls.", ["provider", "result"]),
            "llm_tokens": prom.Counter("ibex_llm_tokens_total", "LLM tokens.", ["kind"]),
            "writes": prom.Counter(
                "ibex_write_outcomes_total", "Memory service write outcomes.", ["status", "code"]
            ),
            "turns_done": prom.Counter("ibex_turns_done_total", "Turns marked done."),
            "repeated_turns": prom.Counter(
                "ibex_repeated_turns_total",
                "Turns that reused the result of an identical LLM input (no LLM call).",
            ),
            "embedding_requests": prom.Counter(
                "ibex_embedding_requests_total",
                "Embedding requests for a turn's memories (one per extracted turn).",
                ["result"],
            ),
            "unknown_refs": prom.Counter(
                "ibex_unknown_refs_total", "replaces refs of an answer the prompt did not list."
            ),
            "supersedes": prom.Counter(
                "ibex_supersedes_total", "replaces refs resolved to memory ids and persisted."
            ),
            "backlog_turns": prom.Gauge(
                "ibex_backlog_turns",
                "Unextracted turns by state, at the last scan.",
                ["state"],
                multiprocess_mode="mostrecent",
            ),
            "backlog_sessions": prom.Gauge(
                "ibex_backlog_sessions",
                "Sessions with unextracted turns, at the last scan.",
                multiprocess_mode="mostrecent",
            ),
            "dead_letters": prom.Gauge(
                "ibex_dead_letters",
                "Open dead letters by queue, at the last scan.",
                ["queue"],
                multiprocess_mode="mostrecent",
            ),
        }

    def llm_call(
        self, provider: str, *, ok: bool, prompt_tokens: int = 0, completion_tokens: int = 0
    ) -> None:
        m = self._metrics()
        m["llm_calls"].labels(provider or "unknown", "ok" if ok else "error").inc()
        if prompt_tokens:
            m["llm_tokens"].labels("prompt").inc(prompt_tokens)
        if completion_tokens:
            m["llm_tokens"].labels("completion").inc(completion_tokens)

    def memory_write(self, status: int | None, code: str | None) -> None:
        self._metrics()["writes"].labels(str(status or "none"), code or "").inc()

    def turn_done(self) -> None:
        self._metrics()["turns_done"].inc()

    def repeated_turn(self) -> None:
        self._metrics()["repeated_turns"].inc()

    def embedding_request(self, *, ok: bool, texts: int = 0) -> None:
        self._metrics()["embedding_requests"].labels("ok" if ok else "error").inc()

    def refs(self, *, resolved: int, unknown: int) -> None:
        m = self._metrics()
        if resolved:
            m["supersedes"].inc(resolved)
        if unknown:
            m["unknown_refs"].inc(unknown)

    def backlog(self, status: Any) -> None:
        m = self._metrics()
        total = status.total
        for state, key in (
            ("pending", "turns_pending"),
            ("in_flight", "turns_in_flight"),
            ("waiting", "turns_waiting"),
            ("failed", "turns_failed"),
        ):
            m["backlog_turns"].labels(state).set(total.get(key, 0))
        m["backlog_sessions"].set(total.get("sessions_pending", 0))
        for queue, counts in status.queues.items():
            dead = max(counts.get("dead_redis", 0), counts.get("dead_mirror", 0))
            m["dead_letters"].labels(queue).set(dead)
