"""The read path: ``POST /v1/memories/search`` and ``POST /v1/context`` (scope memory:read).

Both validate the body with the schemas of :mod:`schema.search` (422 field by field), resolve
the org the same way as every other route and the agent (``agent``, a slug, or ``agent_id``;
one the org does not have is a 404 ``UNKNOWN_AGENT``, not an empty answer) through
:class:`~memory_service.agents.AgentResolver`, and hand the body to
:class:`~memories.search.service.SearchService`, which ranks in Postgres under row-level
security: another org's memories are never candidates.
"""

from __future__ import annotations

import uuid
from typing import Any

import falcon

from memories.scope import ReadScope
from memories.search.service import SearchService
from memories.users import UserService
from memory_service.http import Api, authenticate, json_body, respond_json
from memory_service.memories.endpoints import READ
from schema.search import ContextRequestSchema, SearchRequestSchema
from sessions.agents import AgentResolver

SEARCH_SCHEMA = SearchRequestSchema()
CONTEXT_SCHEMA = ContextRequestSchema()


class _ReadResource:
    """A read that names an agent and whose memories: both resolved the same way for search
    and context."""

    def __init__(
        self, api: Api, service: SearchService, users: UserService, agents: AgentResolver
    ) -> None:
        self.api = api
        self.service = service
        self.users = users
        self.agents = agents

    def _request(
        self, req: falcon.Request, schema: Any
    ) -> tuple[uuid.UUID, dict[str, Any], ReadScope]:
        """The org, the body with its agent resolved to ``agent_id``, and the reader's scope."""
        principal, org_id = authenticate(self.api, req, READ)
        body = self.agents.resolve_body(org_id, json_body(req, self.api, schema))
        return org_id, body, self.users.reader_of(principal, org_id, body)


class SearchResource(_ReadResource):
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        org_id, body, scope = self._request(req, SEARCH_SCHEMA)
        found = self.service.search(org_id, body, scope)
        answer: dict[str, Any] = {"items": [h.as_json() for h in found.hits]}
        if found.details:
            answer["details"] = found.details
        respond_json(resp, 200, answer)


class ContextResource(_ReadResource):
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        org_id, body, scope = self._request(req, CONTEXT_SCHEMA)
        found = self.service.context(org_id, body, scope)
        packed = found.packed
        answer: dict[str, Any] = {
            "context": packed.context,
            "memories": [found.hits[i].as_json() for i in packed.chosen],
            "tokens": packed.tokens,
            "dropped": packed.dropped,
        }
        if found.details:
            answer["details"] = found.details
        respond_json(resp, 200, answer)
