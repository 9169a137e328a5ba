"""The memories routes: ``/v1/memories`` and ``/v1/memories/{id}`` (parse, call, respond).

Resources authenticate, parse and respond; what a write does is decided by
:class:`~memory_service.memories.service.MemoryService`. ``POST /v1/memories`` in order:
authenticate, check the scope and the org, check the idempotency key header, read at most the
body limit, parse, and hand the document to the service, which validates it before it touches
the key.
"""

from __future__ import annotations

import uuid

import falcon

from memory_service.agents import AgentResolver
from memory_service.cursor import encode_cursor
from memory_service.errors import ApiError, dumps
from memory_service.http import (
    Api,
    authenticate,
    list_request,
    parse_json,
    query_params,
    read_body,
    respond,
    respond_json,
)
from memory_service.http import load as load_query
from memory_service.memories.service import MemoryService
from memory_service.users.service import UserService
from schema.memory import (
    MAX_IDEMPOTENCY_KEY_CHARS,
    MemoryListQuerySchema,
    MemoryReadQuerySchema,
)

READ, WRITE = "memory:read", "memory:write"
# Built once: a marshmallow Schema is costly to instantiate and safe to share for load().
LIST_QUERY_SCHEMA = MemoryListQuerySchema()
READ_QUERY_SCHEMA = MemoryReadQuerySchema()


def idempotency_key(req: falcon.Request) -> str | None:
    key = req.get_header("X-Idempotency-Key")
    if key is None:
        return None
    if not key or len(key) > MAX_IDEMPOTENCY_KEY_CHARS or not key.isprintable():
        raise ApiError(
            400,
            "INVALID_HEADER",
            f"X-Idempotency-Key must be 1-{MAX_IDEMPOTENCY_KEY_CHARS} printable characters",
        )
    return key


class MemoriesResource:
    def __init__(
        self,
        api: Api,
        service: MemoryService,
        users: UserService,
        agents: AgentResolver | None = None,
    ) -> None:
        self.api = api
        self.service = service
        self.users = users
        # Given, a list filtered by an agent the org does not have is 404 UNKNOWN_AGENT.
        self.agents = agents

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        api = self.api
        principal, org_id = authenticate(api, req, WRITE)
        key = idempotency_key(req)
        document = parse_json(read_body(req, api.max_body_bytes))
        answer = self.service.create(org_id, key, document, principal).response()
        respond(resp, answer.status, answer.body, location=answer.location, headers=answer.headers)

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        principal, org_id, after, query = list_request(self.api, req, READ, LIST_QUERY_SCHEMA)
        limit = query["limit"]
        filters = {name: query.get(name) for name in ("agent_id", "session_id")}
        if self.agents is not None and filters["agent_id"] is not None:
            self.agents.resolve(org_id, agent_id=filters["agent_id"])
        # Supersession: current memories unless include_superseded.
        filters["include_superseded"] = query["include_superseded"]
        scope = self.users.reader_of(principal, org_id, query)
        rows = self.service.list(org_id, **filters, limit=limit + 1, after=after, scope=scope)
        last = rows[limit - 1] if len(rows) > limit else None
        next_cursor = encode_cursor(last.created_at, last.id) if last else None
        respond(
            resp,
            200,
            dumps({"items": [r.as_json() for r in rows[:limit]], "next_cursor": next_cursor}),
        )


class MemoryResource:
    def __init__(self, api: Api, service: MemoryService, users: UserService) -> None:
        self.api = api
        self.service = service
        self.users = users

    def on_get(self, req: falcon.Request, resp: falcon.Response, memory_id: uuid.UUID) -> None:
        principal, org_id = authenticate(self.api, req, READ)
        query = load_query(READ_QUERY_SCHEMA, query_params(req))
        scope = self.users.reader_of(principal, org_id, query)
        respond_json(resp, 200, self.service.get(org_id, memory_id, scope).as_json())

    def on_delete(self, req: falcon.Request, resp: falcon.Response, memory_id: uuid.UUID) -> None:
        """A token deletes only what it can read: a person's memory needs that person's
        token, a request naming the user (``?user=``), or the ``memory:admin`` scope; another
        person's memory is not found, exactly as an unknown one."""
        principal, org_id = authenticate(self.api, req, WRITE)
        query = load_query(READ_QUERY_SCHEMA, query_params(req))
        self.service.delete(org_id, memory_id, self.users.deleter_of(principal, org_id, query))
        resp.status = 204


class MemoryHistoryResource:
    """``GET /v1/memories/{id}/history``: the chain of supersessions the memory belongs to,
    oldest first (superseded memories with their ``superseded_by``, the current one last)."""

    def __init__(self, api: Api, service: MemoryService, users: UserService) -> None:
        self.api = api
        self.service = service
        self.users = users

    def on_get(self, req: falcon.Request, resp: falcon.Response, memory_id: uuid.UUID) -> None:
        principal, org_id = authenticate(self.api, req, READ)
        # Whose memories the read may return, as GET /v1/memories/{id}: another person's
        # chain is not found.
        query = load_query(READ_QUERY_SCHEMA, query_params(req))
        scope = self.users.reader_of(principal, org_id, query)
        rows = self.service.history(org_id, memory_id, scope)
        respond_json(resp, 200, {"items": [r.as_json() for r in rows]})
