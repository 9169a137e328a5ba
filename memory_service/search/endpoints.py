"""The read path: ``POST /v1/memories/search`` and ``POST /v1/context`` (scope memory:read).

Both validate the body with the schemas of :mod:`schema.search` (422 field by field), resolve
the org the same way as every other route, and rank in Postgres through
:class:`~memory_service.search.store.SearchStore`, under row-level security: another org's
memories are never candidates.
"""

from __future__ import annotations

import falcon

from memory_service.http import Api, authenticate, json_body, respond_json
from memory_service.memories.endpoints import READ
from memory_service.search.context import pack, query_from_messages
from memory_service.search.store import SearchStore
from schema.search import MAX_SEARCH_LIMIT, ContextRequestSchema, SearchRequestSchema

SEARCH_SCHEMA = SearchRequestSchema()
CONTEXT_SCHEMA = ContextRequestSchema()


class SearchResource:
    def __init__(self, api: Api, searches: SearchStore) -> None:
        self.api = api
        self.searches = searches

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        _, org_id = authenticate(self.api, req, READ)
        body = json_body(req, self.api, SEARCH_SCHEMA)
        hits = self.searches.search(
            org_id,
            body["agent_id"],
            body["query"],
            limit=body["limit"],
            session_id=body["session_id"],
            kinds=body["kinds"],
        )
        respond_json(resp, 200, {"items": [h.as_json() for h in hits]})


class ContextResource:
    def __init__(self, api: Api, searches: SearchStore) -> None:
        self.api = api
        self.searches = searches

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        _, org_id = authenticate(self.api, req, READ)
        body = json_body(req, self.api, CONTEXT_SCHEMA)
        query = (
            body["query"] if body["query"] is not None else query_from_messages(body["messages"])
        )
        hits = self.searches.search(
            org_id,
            body["agent_id"],
            query,
            limit=MAX_SEARCH_LIMIT,
            session_id=body["session_id"],
            kinds=body["kinds"],
        )
        packed = pack([h.row.content for h in hits], body["max_tokens"])
        respond_json(
            resp,
            200,
            {
                "context": packed.context,
                "memories": [hits[i].as_json() for i in packed.chosen],
                "tokens": packed.tokens,
                "dropped": packed.dropped,
            },
        )
