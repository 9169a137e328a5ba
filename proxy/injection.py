"""``X-IBEX-Memory: inject``: the context block for the conversation, put into its system prompt.

The block is the one ``POST /v1/context`` answers (:class:`~memory_service.search.service.
SearchService`: the query from the last user messages, the best memories of the user's scope
packed into the token budget), delimited by ``<memories>`` ... ``</memories>``
(:mod:`schema.recall`). It goes at the end of the first system message, or in a system message
of its own at the front when there is none. The user's scope is that of ``POST /v1/context``:
the named user's memories and the agent-wide ones (a user-bound token's user wins), or the
agent-wide ones alone without a user. The turn is recorded with the block in it, as the
upstream saw it, and the extractor removes such blocks before the LLM reads a turn: recalled
memories are never extracted again.
"""

from __future__ import annotations

import uuid
from typing import Any

import peewee

from core.db import tenant
from embeddings import QueryCache
from memory_service.scope import AGENT_WIDE, ReadScope
from memory_service.search.service import SearchService
from memory_service.search.store import SearchStore
from models.store import SessionStore

DEFAULT_MEMORY_TOKENS = 400
MAX_MEMORY_TOKENS = 8000
SYSTEM_ROLES = ("system", "developer")


class Injector:
    def __init__(self, db: peewee.Database, queries: QueryCache | None = None) -> None:
        self.db = db
        # The same ranking as POST /v1/context: fused with the semantic signal when an
        # embedder is configured (``queries``), lexical otherwise or while it is down.
        self.search = SearchService(SearchStore(db), queries)

    def agent_id(self, org_id: uuid.UUID, slug: str) -> uuid.UUID | None:
        with tenant(self.db, org_id):
            row = self.db.execute_sql(
                "SELECT id FROM ibex_core.agents WHERE slug = %s", (slug,)
            ).fetchone()
        return uuid.UUID(str(row[0])) if row else None

    def scope(
        self, org_id: uuid.UUID, user: str | None, bound: uuid.UUID | None = None
    ) -> ReadScope:
        """Whose memories: a user-bound token's user, else the user named by its key (their
        memories and the agent-wide ones; a key no user has: the agent-wide ones), else the
        agent-wide memories only, as ``POST /v1/context`` reads them."""
        if bound is not None:
            return ReadScope(user_id=bound, named=True)
        if user is None:
            return AGENT_WIDE
        found = SessionStore(self.db, bind_models=False).find_user(org_id, user)
        return ReadScope(user_id=found, named=True)

    def block(
        self,
        org_id: uuid.UUID,
        agent: str,
        messages: list[Any],
        max_tokens: int,
        user: str | None = None,
        bound: uuid.UUID | None = None,
    ) -> str | None:
        """The context block for ``messages`` among the memories of the user's scope, or None
        when there is nothing to add."""
        agent_id = self.agent_id(org_id, agent)
        if agent_id is None:
            return None
        context = self.search.context(
            org_id,
            {
                "agent_id": agent_id,
                "query": None,
                "messages": messages,
                "max_tokens": max_tokens,
                "session_id": None,
                "kinds": None,
            },
            self.scope(org_id, user, bound),
        )
        if not context.packed.chosen:
            return None
        return context.packed.context


def with_block(messages: list[Any], block: str) -> list[Any]:
    """``messages`` with ``block`` at the end of the first system prompt (a new one when there
    is none); the caller's list is not changed."""
    out = list(messages)
    for i, message in enumerate(out):
        if not isinstance(message, dict) or message.get("role") not in SYSTEM_ROLES:
            continue
        content = message.get("content")
        if isinstance(content, str):
            out[i] = {**message, "content": f"{content}\n\n{block}" if content else block}
            return out
        if isinstance(content, list):
            out[i] = {**message, "content": [*content, {"type": "text", "text": block}]}
            return out
    return [{"role": "system", "content": block}, *out]


def memory_tokens(header: str | None) -> int:
    """The budget of ``X-IBEX-Memory-Tokens``: default 400, at least 1, at most 8000; a
    value that is not a number is a ValueError."""
    if header is None or not header.strip():
        return DEFAULT_MEMORY_TOKENS
    value = int(header.strip())
    if value < 1:
        raise ValueError("X-IBEX-Memory-Tokens must be at least 1")
    return min(value, MAX_MEMORY_TOKENS)
