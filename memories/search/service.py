"""The read flows: a search, and the context block built from one. No HTTP.

A search ranks in Postgres (:class:`~memories.search.store.SearchStore`, under row-level
security). A context block is the person, then the moment:

1. **standing facts**: the reader's scope's newest :data:`PROFILE_ROWS` current memories are
   read (one indexed read, :meth:`SearchStore.profile`). When they are all of the scope's and
   their block fits ``max_tokens``, all of them are the standing facts (the rule's first, then
   the others in the query's order); otherwise the ones the rule of
   :mod:`memories.search.profile` picks, within :data:`STANDING_SHARE` of the budget.
   Chosen without the query, so a question that shares nothing with the allergy still gets it;
2. **the moment**: the query (from the request, or the conversation's last user messages) is
   searched with the widest limit, the standing facts' signals computed in the same statement,
   and its hits whose score reaches the model's relevance bar
   (:attr:`~memories.search.store.Calibration.relevance`) fill the rest of the budget,
   best first, each memory once (:mod:`memories.search.context` packs).

So a question with no answer gets the person and nothing else: a hit below the bar (the
scope's nearest memories by meaning are hits of a ranked search, whatever was asked) is never
packed.

With an embedder the query is embedded first (a per-process LRU of query vectors, so a
repeated question costs nothing) and the ranking fuses the semantic signal. When the embedder
fails (down, slow past its timeout, a bad answer) the search is answered lexically, every
hit's ``semantic`` is null, and the answer says so in ``details``: never a 5xx.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.errors import EmbeddingsUnavailable
from embeddings import QueryCache
from memories.metrics import MemoryMetrics
from memories.pending_vectors import PendingVectors
from memories.scope import AGENT_WIDE, ReadScope
from memories.search.context import Packed, fits, pack_parts, query_from_messages
from memories.search.profile import standing_facts
from memories.search.store import RankedMemory, SearchStore, SemanticQuery, calibration
from schema.search import MAX_SEARCH_LIMIT

log = logging.getLogger(__name__)

#: The ``details`` note of an answer ranked without the semantic signal because of a failure.
SEMANTIC_UNAVAILABLE = "semantic search unavailable ({reason}); ranked by full-text and trigram"
#: The newest memories of the scope read for a context's standing facts: "all of the person's
#: memories" means all of these, when the scope has no more.
PROFILE_ROWS = 200
#: The share of ``max_tokens`` the standing facts may take when not all of the person's
#: memories fit: the rest is the query's.
STANDING_SHARE = 0.75


@dataclass(frozen=True)
class SearchAnswer:
    """The hits, best first, and what the answer should say about how it was ranked."""

    hits: list[RankedMemory]
    details: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ContextAnswer:
    """The packed block and the hits it was packed from (``packed.chosen`` indexes them)."""

    hits: list[RankedMemory]
    packed: Packed
    details: dict[str, str] = field(default_factory=dict)
    #: How many of ``hits`` (the first ones) are standing facts; the others are the query's,
    #: each with a score of at least ``relevance``.
    standing: int = 0
    relevance: float = 0.0


class SearchService:
    def __init__(
        self,
        searches: SearchStore,
        queries: QueryCache | None = None,
        *,
        metrics: MemoryMetrics | None = None,
        pending: PendingVectors | None = None,
    ) -> None:
        self.searches = searches
        #: The query embedder (with its cache); None: lexical search only.
        self.queries = queries
        self.metrics = metrics
        #: The vectors of this process's recent writes, stored before a semantic read (a
        #: memory written then searched for through the same process is found by meaning).
        self.pending = pending

    def search_mode(self) -> str:
        """What ``/readyz`` says, e.g. ``full-text+trigram+semantic``."""
        return self.searches.search_mode(semantic=self.queries is not None)

    def search(
        self, org_id: uuid.UUID, request: Mapping[str, Any], scope: ReadScope = AGENT_WIDE
    ) -> SearchAnswer:
        """The hits of a loaded ``schema.search.SearchRequestSchema`` body, best first, among
        the memories of the reader's ``scope``."""
        return self._search(
            org_id,
            request,
            request["query"],
            request["limit"],
            scope,
            min_score=request.get("min_score", 0.0),
        )

    def find(
        self,
        org_id: uuid.UUID,
        agent_id: uuid.UUID,
        query: str,
        *,
        limit: int = 10,
        session_id: uuid.UUID | None = None,
        kinds: Sequence[str] | None = None,
        include_superseded: bool = False,
        scope: ReadScope = AGENT_WIDE,
        min_score: float = 0.0,
    ) -> SearchAnswer:
        """The same search with plain arguments (the command line, benchmarks)."""
        request = {
            "agent_id": agent_id,
            "session_id": session_id,
            "kinds": list(kinds) if kinds else None,
            "include_superseded": include_superseded,
        }
        return self._search(org_id, request, query, limit, scope, min_score=min_score)

    def context(
        self, org_id: uuid.UUID, request: Mapping[str, Any], scope: ReadScope = AGENT_WIDE
    ) -> ContextAnswer:
        """The block of a loaded ``schema.search.ContextRequestSchema`` body for the reader's
        ``scope``: the standing facts, then the query's hits above the relevance bar (module
        docstring)."""
        query = request["query"]
        if query is None:
            query = query_from_messages(request["messages"])
        max_tokens = request["max_tokens"]
        if scope.empty:
            return ContextAnswer([], pack_parts([], [], max_tokens, standing_tokens=0))
        rows = self.searches.profile(
            org_id,
            request["agent_id"],
            scope,
            limit=PROFILE_ROWS + 1,
            session_id=request["session_id"],
            kinds=request["kinds"],
        )
        everything = len(rows) <= PROFILE_ROWS and fits([r.content for r in rows], max_tokens)
        standing = standing_facts(rows)
        chosen = {r.id for r in standing}
        rest = [r for r in rows[:PROFILE_ROWS] if r.id not in chosen]
        if everything:
            standing_tokens = max_tokens
            pinned = rows
        else:
            # The rule's first, then the person's other memories newest first, within the
            # share: chosen without the query (so never a random neighbour of it), and packed
            # before the search, so that only those are ranked with it.
            standing_tokens = int(max_tokens * STANDING_SHARE)
            ordered = [*standing, *rest]
            head = pack_parts(
                [r.content for r in ordered], [], max_tokens, standing_tokens=standing_tokens
            )
            pinned = [ordered[i] for i in head.chosen]
        semantic, details = self._semantic(query)
        bar = calibration(semantic.model if semantic is not None else None).relevance
        ranked = self.searches.rank(
            org_id,
            request["agent_id"],
            query,
            limit=MAX_SEARCH_LIMIT,
            session_id=request["session_id"],
            kinds=request["kinds"],
            include_superseded=request.get("include_superseded", False),
            scope=scope,
            semantic=semantic,
            # Only the hits above the bar are packed, unless all of the person's memories
            # are (their order is the query's, hits below the bar included): the store then
            # ranks in full only the candidates that can reach the bar.
            min_score=0.0 if everything else bar,
            pinned=[r.id for r in pinned],
        )
        if everything:
            # All of the person's memories: the rule's first, then the others in the query's
            # order (its hits by rank, then the rest newest first, as read).
            order = {h.row.id: i for i, h in enumerate(ranked.hits)}
            rest.sort(key=lambda r: order.get(r.id, len(order)))
            pinned = [*standing, *rest]
        first_hits = [ranked.pinned[r.id] for r in pinned if r.id in ranked.pinned]
        texts = [h.row.content for h in first_hits]
        head = pack_parts(texts, [], max_tokens, standing_tokens=standing_tokens)
        packed_ids = {first_hits[i].row.id for i in head.chosen}
        # Each memory once: a hit already packed as a standing fact is not packed again.
        relevant = [h for h in ranked.hits if h.score >= bar and h.row.id not in packed_ids]
        packed = pack_parts(
            texts, [h.row.content for h in relevant], max_tokens, standing_tokens=standing_tokens
        )
        hits = [*first_hits, *relevant]
        eligible = {h.row.id for h in hits}
        packed = dataclasses.replace(
            packed, dropped=len(eligible) - len({hits[i].row.id for i in packed.chosen})
        )
        return ContextAnswer(hits, packed, details, len(first_hits), bar)

    def _semantic(self, query: str) -> tuple[SemanticQuery | None, dict[str, str]]:
        if self.queries is None or not query.strip():
            return None, {}
        if self.pending is not None:
            self.pending.flush()
        try:
            vector = self.queries.embed_query(query)
        except EmbeddingsUnavailable as exc:
            if self.metrics is not None:
                self.metrics.semantic_unavailable.inc()
            log.warning("search answered lexically: %s", exc)
            return None, {"semantic": SEMANTIC_UNAVAILABLE.format(reason=exc)}
        if not any(vector):
            return None, {}  # nothing the model knows in the query: the words alone
        return SemanticQuery(self.queries.model, vector), {}

    def _search(
        self,
        org_id: uuid.UUID,
        request: Mapping[str, Any],
        query: str,
        limit: int,
        scope: ReadScope,
        *,
        min_score: float = 0.0,
    ) -> SearchAnswer:
        if scope.empty:
            return SearchAnswer([])
        semantic, details = self._semantic(query)
        hits = self.searches.search(
            org_id,
            request["agent_id"],
            query,
            limit=limit,
            session_id=request["session_id"],
            kinds=request["kinds"],
            include_superseded=request.get("include_superseded", False),
            scope=scope,
            semantic=semantic,
            min_score=min_score,
        )
        return SearchAnswer(hits, details)
