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
``usage_llm_calls_total``          counter  by ``org`` (id) and ``model``: the call of each
                                            stored answer (0 for a reused result), counted
                                            when the result is stored, once per turn
``usage_tokens_total``             counter  by ``org``, ``model`` and ``kind`` (input, output,
                                            embedding), counted with the stored result
``budget_waits_total``             counter  deliveries held back by the org's spent budget
``budget_thresholds_total``        counter  budget thresholds crossed by ``org`` and
                                            ``threshold`` (80, 100)
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

    def usage(
        self,
        org: str,
        model: str | None,
        *,
        llm_calls: int,
        input_tokens: int,
        output_tokens: int,
        embedding_tokens: int,
    ) -> None:
        """A turn's usage, counted when its result is stored (once per turn)."""

    def budget_wait(self, org: str) -> None:
        """A turn of ``org`` found its budget spent: no LLM call, it waits."""

    def budget_threshold(self, org: str, percent: int) -> None:
        """``org`` crossed ``percent`` (80, 100) of its token budget."""


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
            "usage_calls": prom.Counter(
                "ibex_usage_llm_calls_total",
                "LLM calls of extracted turns, counted with their result, by org and model.",
                ["org", "model"],
            ),
            "usage_tokens": prom.Counter(
                "ibex_usage_tokens_total",
                "Tokens of extracted turns, counted with their result, by org, model and kind"
                " (input, output, embedding).",
                ["org", "model", "kind"],
            ),
            "budget_waits": prom.Counter(
                "ibex_budget_waits_total",
                "Deliveries of a turn held back by its org's spent token budget (no LLM call).",
                ["org"],
            ),
            "budget_thresholds": prom.Counter(
                "ibex_budget_thresholds_total",
                "Token budget thresholds (80, 100 percent) crossed, by org.",
                ["org", "threshold"],
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

    def budget_wait(self, org: str) -> None:
        self._metrics()["budget_waits"].labels(org).inc()

    def budget_threshold(self, org: str, percent: int) -> None:
        self._metrics()["budget_thresholds"].labels(org, str(percent)).inc()

    def usage(
        self,
        org: str,
        model: str | None,
        *,
        llm_calls: int,
        input_tokens: int,
        output_tokens: int,
        embedding_tokens: int,
    ) -> None:
        m = self._metrics()
        label = model or "unknown"
        m["usage_calls"].labels(org, label).inc(llm_calls)
        for kind, n in (
            ("input", input_tokens),
            ("output", output_tokens),
            ("embedding", embedding_tokens),
        ):
            if n:
                m["usage_tokens"].labels(org, label, kind).inc(n)

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
