"""What the memories' flows count, as an interface: the web process's Prometheus series
(``memory_service.metrics.Metrics``) implement it, so the flows know counters and not the
server that exposes them."""

from __future__ import annotations

from typing import Any, Protocol


class Counter(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class LabelledCounter(Protocol):
    def labels(self, *values: Any) -> Counter: ...


class MemoryMetrics(Protocol):
    """The series a write and a read count (docs/operations.md, "Metrics")."""

    @property
    def replays(self) -> LabelledCounter:
        """Idempotent replays by ``source``: ``redis`` or ``postgres``."""
        ...

    @property
    def conflicts(self) -> LabelledCounter:
        """Conflicts by ``code``: IDEMPOTENCY_CONFLICT, IDEMPOTENCY_IN_PROGRESS,
        DUPLICATE_CONTENT."""
        ...

    @property
    def near_duplicates(self) -> Counter:
        """Writes refused as near-duplicates."""
        ...

    @property
    def embeddings_failed(self) -> Counter:
        """Memories stored without a vector because the embedder failed."""
        ...

    @property
    def semantic_unavailable(self) -> Counter:
        """Searches answered lexically because the query could not be embedded."""
        ...

    @property
    def supersessions(self) -> Counter:
        """Memories marked superseded by a new one."""
        ...

    @property
    def idempotency_unavailable(self) -> Counter:
        """Writes with a key run without Redis."""
        ...
