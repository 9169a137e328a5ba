"""The backfill: vectors for the memories that lack one of the configured model, in batches
(``ibex reembed``, and the scheduler's round after an embedder outage)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from embeddings import Embedder
from memories.vectors import EmbeddingStore, unit_pairs


@dataclass
class BackfillReport:
    """What one backfill did for one org."""

    #: Memories read that lacked a vector of the model (all of them with ``replace``).
    memories: int = 0
    #: Vectors stored.
    embedded: int = 0
    #: Requests made to the embedder (one per batch).
    requests: int = 0


def backfill(
    embeddings: EmbeddingStore,
    embedder: Embedder,
    org_id: uuid.UUID,
    *,
    agent_id: uuid.UUID | None = None,
    batch_size: int = 100,
    replace: bool = False,
    max_batches: int | None = None,
    on_batch: Callable[[BackfillReport], None] | None = None,
) -> BackfillReport:
    """Embed the org's live memories lacking a vector of ``embedder``'s model (every live
    memory with ``replace``), ``batch_size`` texts per request, in id order, each batch
    stored in its own statement: an interrupted run loses at most a batch, and a rerun
    continues with what is still missing. Raises
    :class:`~core.errors.EmbeddingsUnavailable` when the embedder fails (what was stored
    stays) and :class:`~memories.vectors.EmbeddingDimensionError` when the model
    was stored with another dimension."""
    embeddings.register(embedder.model, embedder.dimension)
    report = BackfillReport()
    after: uuid.UUID | None = None
    batches = 0
    while max_batches is None or batches < max_batches:
        rows = embeddings.missing(
            org_id,
            embedder.model,
            agent_id=agent_id,
            after=after,
            limit=batch_size,
            replace=replace,
        )
        if not rows:
            break
        batches += 1
        vectors = embedder.embed([content for _, content in rows])
        report.requests += 1
        pairs = unit_pairs(zip([memory_id for memory_id, _ in rows], vectors, strict=True))
        report.memories += len(rows)
        report.embedded += embeddings.put(org_id, embedder.model, embedder.dimension, pairs)
        after = rows[-1][0]
        if on_batch is not None:
            on_batch(report)
        if len(rows) < batch_size:
            break
    return report
