"""The read flows: a search, and the context block built from one. No HTTP.

A search ranks in Postgres (:class:`~memories.search.store.SearchStore`, under row-level
security); the context takes its query from the request or from the conversation's last user
messages, searches with the widest limit, and packs the best memories into the token budget
(:mod:`memories.search.context`).

With an embedder the query is embedded first (a per-process LRU of query vectors, so a
repeated question costs nothing) and the ranking fuses the semantic signal. When the embedder
fails (down, slow past its timeout, a bad answer) the search is answered lexically, every
hit's ``semantic`` is null, and the answer says so in ``details``: never a 5xx.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.errors import EmbeddingsUnavailable
from embeddings import QueryCache
from memories.metrics import MemoryMetrics
from memories.scope import AGENT_WIDE, ReadScope
from memories.search.context import Packed, pack, query_from_messages
from memories.search.store import RankedMemory, SearchStore, SemanticQuery
from schema.search import MAX_SEARCH_LIMIT

log = logging.getLogger(__name__)

#: The ``details`` note of an answer ranked without the semantic signal because of a failure.
SEMANTIC_UNAVAILABLE = "semantic search unavailable ({reason}); ranked by full-text and trigram"


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


class SearchService:
    def __init__(
        self,
        searches: SearchStore,
        queries: QueryCache | None = None,
        *,
        metrics: MemoryMetrics | None = None,
    ) -> None:
        self.searches = searches
        #: The query embedder (with its cache); None: lexical search only.
        self.queries = queries
        self.metrics = metrics

    def search_mode(self) -> str:
        """What ``/readyz`` says, e.g. ``full-text+trigram+semantic``."""
        return self.searches.search_mode(semantic=self.queries is not None)

    def search(
        self, org_id: uuid.UUID, request: Mapping[str, Any], scope: ReadScope = AGENT_WIDE
    ) -> SearchAnswer:
        """The hits of a loaded ``schema.search.SearchRequestSchema`` body, best first, among
        the memories of the reader's ``scope``."""
        return self._search(org_id, request, request["query"], request["limit"], scope)

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
    ) -> SearchAnswer:
        """The same search with plain arguments (the command line, benchmarks)."""
        request = {
            "agent_id": agent_id,
            "session_id": session_id,
            "kinds": list(kinds) if kinds else None,
            "include_superseded": include_superseded,
        }
        return self._search(org_id, request, query, limit, scope)

    def context(
        self, org_id: uuid.UUID, request: Mapping[str, Any], scope: ReadScope = AGENT_WIDE
    ) -> ContextAnswer:
        """The block of a loaded ``schema.search.ContextRequestSchema`` body, packed from the
        memories of the reader's ``scope`` (ranked exactly as a search)."""
        query = request["query"]
        if query is None:
            query = query_from_messages(request["messages"])
        found = self._search(org_id, request, query, MAX_SEARCH_LIMIT, scope)
        hits = found.hits
        return ContextAnswer(
            hits, pack([h.row.content for h in hits], request["max_tokens"]), found.details
        )

    def _semantic(self, query: str) -> tuple[SemanticQuery | None, dict[str, str]]:
        if self.queries is None or not query.strip():
            return None, {}
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
        )
        return SearchAnswer(hits, details)
