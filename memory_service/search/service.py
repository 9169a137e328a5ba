"""The read flows: a search, and the context block built from one. No HTTP.

A search ranks in Postgres (:class:`~memory_service.search.store.SearchStore`, under row-level
security); the context takes its query from the request or from the conversation's last user
messages, searches with the widest limit, and packs the best memories into the token budget
(:mod:`memory_service.search.context`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memory_service.scope import AGENT_WIDE, ReadScope
from memory_service.search.context import Packed, pack, query_from_messages
from memory_service.search.store import SearchHit, SearchStore
from schema.search import MAX_SEARCH_LIMIT


@dataclass(frozen=True)
class Context:
    """The packed block and the hits it was packed from (``packed.chosen`` indexes them)."""

    hits: list[SearchHit]
    packed: Packed


class SearchService:
    def __init__(self, searches: SearchStore) -> None:
        self.searches = searches

    def search(
        self, org_id: uuid.UUID, request: Mapping[str, Any], scope: ReadScope = AGENT_WIDE
    ) -> list[SearchHit]:
        """The hits of a loaded ``schema.search.SearchRequestSchema`` body, best first, among
        the memories of the reader's ``scope``."""
        return self._search(org_id, request, request["query"], request["limit"], scope)

    def context(
        self, org_id: uuid.UUID, request: Mapping[str, Any], scope: ReadScope = AGENT_WIDE
    ) -> Context:
        """The block of a loaded ``schema.search.ContextRequestSchema`` body, packed from the
        memories of the reader's ``scope``."""
        query = request["query"]
        if query is None:
            query = query_from_messages(request["messages"])
        hits = self._search(org_id, request, query, MAX_SEARCH_LIMIT, scope)
        return Context(hits, pack([h.row.content for h in hits], request["max_tokens"]))

    def _search(
        self,
        org_id: uuid.UUID,
        request: Mapping[str, Any],
        query: str,
        limit: int,
        scope: ReadScope,
    ) -> list[SearchHit]:
        if scope.empty:
            return []
        return self.searches.search(
            org_id,
            request["agent_id"],
            query,
            limit=limit,
            session_id=request["session_id"],
            kinds=request["kinds"],
            include_superseded=request.get("include_superseded", False),
            scope=scope,
        )
