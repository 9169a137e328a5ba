"""Search: a query for an agent and optionally a person; the hits with every signal behind
their rank, and the context block exactly as the chat path would inject it. Both answers come
from :class:`~memories.search.service.SearchService`, with the reader's scope decided by
:class:`~memories.users.UserService` as for ``POST /v1/memories/search`` and ``/v1/context``."""

from __future__ import annotations

from typing import Any

import falcon
from marshmallow import ValidationError

from memories.errors import UserForbiddenError
from memories.search.store import HIGHLIGHT_START, HIGHLIGHT_STOP
from memory_service.console import reads
from memory_service.console.base import Page
from memory_service.console.conversations import _options
from memory_service.console.markup import Markup, esc, fmt, table
from memory_service.console.people import no_such_person, source_link
from memory_service.console.session import Refused, Viewer
from schema.search import ContextRequestSchema, SearchRequestSchema

READ = "memory:read"
SEARCH_SCHEMA = SearchRequestSchema()
CONTEXT_SCHEMA = ContextRequestSchema()
HITS = 20
CONTEXT_TOKENS = 400


def snippet(text: str) -> Markup:
    """The highlighted snippet: the text escaped, then only the highlight marks let through."""
    escaped = str(esc(text))
    for mark in (HIGHLIGHT_START, HIGHLIGHT_STOP):
        escaped = escaped.replace(str(esc(mark)), mark)
    return Markup(escaped)


def signal(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


class SearchPage(Page):
    def get(self, req: falcon.Request, who: Viewer, **_: Any) -> tuple[str, Markup]:
        who.need(READ)
        org_id = who.need_org()
        deps = self.deps
        agents = reads.agents(deps.db, org_id)
        agent = req.get_param("agent") or (agents[0][1] if agents else None)
        user = req.get_param("user") or None
        query = req.get_param("q") or ""
        form = fmt(
            '<form method="get" action="/console/search" class="filters">{}'
            '<label>Agent {}</label> <label>Person <input name="user" value="{}"></label> '
            '<label class="wide">Query <input name="q" value="{}" size="50"></label> '
            '<button type="submit">Search</button></form>',
            Markup(
                fmt('<input type="hidden" name="org" value="{}">', who.org_param)
                if who.org_param
                else ""
            ),
            _options("agent", [s for _, s in agents], agent, "choose"),
            user or "",
            query,
        )
        if not query.strip() or agent is None:
            return "Search", form
        agent_id = deps.agents.find(org_id, slug=agent)
        if agent_id is None:
            raise Refused(404, "No such agent", "this org has no agent of that name")
        named = {"agent_id": str(agent_id), "query": query, **({"user": user} if user else {})}
        try:
            search = SEARCH_SCHEMA.load({**named, "limit": HITS})
            ask = CONTEXT_SCHEMA.load({**named, "max_tokens": CONTEXT_TOKENS})
        except ValidationError as exc:
            raise Refused(422, "Bad request", str(exc.messages)) from None
        try:
            scope = deps.users.reader_of(who.principal, org_id, search)
        except UserForbiddenError:
            raise no_such_person() from None
        found = deps.searches.search(org_id, search, scope)
        context = deps.searches.context(org_id, ask, scope)
        rows = [
            [
                f"{h.score:.3f}",
                signal(h.text),
                signal(h.trigram),
                signal(h.recency),
                signal(h.semantic),
                "-" if h.semantic_rank is None else h.semantic_rank,
                h.row.kind,
                snippet(h.snippet),
                source_link(who, h.row),
            ]
            for h in found.hits
        ]
        headers = ["score", "text", "trigram", "recency", "semantic", "rank", "kind", "memory"]
        details = (
            fmt('<p class="meta">{}</p>', "; ".join(f"{k}: {v}" for k, v in found.details.items()))
            if found.details
            else Markup("")
        )
        packed = context.packed
        block = fmt(
            "<h2>Context block</h2>"
            '<p class="meta">{} estimated tokens of {} · {} memorie(s) dropped</p>'
            '<pre class="context">{}</pre>',
            packed.tokens,
            CONTEXT_TOKENS,
            packed.dropped,
            packed.context,
        )
        return (
            "Search",
            form
            + fmt("<h2>Hits</h2>")
            + details
            + table([*headers, "source"], rows, empty="No memory matches.")
            + block,
        )
