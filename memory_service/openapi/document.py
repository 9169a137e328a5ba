"""The OpenAPI 3 document of the service, generated from the marshmallow schemas (apispec).

Every route, every status code it can answer and every body, including the error body, is
listed here; a test walks the app's routes and checks nothing is missing.
"""

from __future__ import annotations

from typing import Any

from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin

from memory_service.openapi.parts import (
    ONE_USER,
    ORG_HEADER,
    PRINTABLE_HEADER_PATTERN,
    RETRY_AFTER,
    UNKNOWN_AGENT,
    error,
    exactly_one_of,
    null_only_alternatives,
    with_org_errors,
)
from memory_service.openapi.sessions import document as document_sessions
from memory_service.openapi.sessions import finish as finish_sessions
from memory_service.openapi.users import document as document_users
from schema.memory import (
    ERROR_CODES,
    MAX_IDEMPOTENCY_KEY_CHARS,
    ErrorSchema,
    HealthSchema,
    MemoryCreateSchema,
    MemoryDeleteQuerySchema,
    MemoryHistorySchema,
    MemoryListQuerySchema,
    MemoryPageSchema,
    MemoryReadQuerySchema,
    MemorySchema,
)
from schema.search import (
    ContextRequestSchema,
    ContextResultSchema,
    SearchRequestSchema,
    SearchResultSchema,
)

TITLE = "IBEX memory service"
VERSION = "1.0.0"


MEMORY_ID = {
    "in": "path",
    "name": "memory_id",
    "required": True,
    "schema": {"type": "string", "format": "uuid"},
}


def build_spec(max_body_bytes: int, embedding: tuple[str, int] | None = None) -> dict[str, Any]:
    """The document. ``embedding``: the (model, dimension) of the service's embedder, the
    only vectors a write may carry (without one a vector is accepted and not stored)."""
    spec = APISpec(
        title=TITLE,
        version=VERSION,
        openapi_version="3.0.3",
        plugins=[MarshmallowPlugin()],
        info={
            "description": "Stores memories with durable idempotency and exact dedup."
            ' Every error body is `{"error": {"code", "message", '
            "...}}`; codes: " + ", ".join(ERROR_CODES) + "."
        },
    )
    spec.components.security_scheme("bearer", {"type": "http", "scheme": "bearer"})
    for name, schema in (
        ("Memory", MemorySchema),
        ("MemoryPage", MemoryPageSchema),
        ("MemoryHistory", MemoryHistorySchema),
        ("Error", ErrorSchema),
        ("Health", HealthSchema),
        ("SearchResult", SearchResultSchema),
        ("ContextResult", ContextResultSchema),
    ):
        spec.components.schema(name, schema=schema)
    # The rule the schema's validator enforces, which its fields cannot say.
    one_agent = exactly_one_of(agent="string", agent_id="string")
    spec.components.schema("MemoryCreate", component=ONE_USER, schema=MemoryCreateSchema)
    spec.components.schema(
        "SearchRequest", component={"allOf": [one_agent, ONE_USER]}, schema=SearchRequestSchema
    )
    spec.components.schema(
        "ContextRequest",
        component={
            "allOf": [exactly_one_of(query="string", messages="array"), one_agent, ONE_USER]
        },
        schema=ContextRequestSchema,
    )

    secured: list[dict[str, list[str]]] = [{"bearer": []}]
    location = {"Location": {"description": "The new memory.", "schema": {"type": "string"}}}
    replayed = {
        "Idempotent-Replayed": {
            "description": "`true` when answered from the idempotency record.",
            "schema": {"type": "string", "enum": ["true"]},
        }
    }
    spec.path(
        path="/v1/memories",
        operations={
            "post": {
                "operationId": "createMemory",
                "summary": "Store a memory (idempotent with X-Idempotency-Key).",
                "security": secured,
                "parameters": [
                    ORG_HEADER,
                    {
                        "in": "header",
                        "name": "X-Idempotency-Key",
                        "required": False,
                        "description": "Scoped per org. The same key with the same body "
                        "replays the first answer; with another body it conflicts. Printable "
                        "characters (else 400 INVALID_HEADER).",
                        "schema": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": MAX_IDEMPOTENCY_KEY_CHARS,
                            "pattern": PRINTABLE_HEADER_PATTERN,
                        },
                    },
                ],
                "requestBody": {
                    "required": True,
                    "description": f"At most {max_body_bytes} bytes.",
                    "content": {"application/json": {"schema": "MemoryCreate"}},
                },
                "responses": with_org_errors(
                    {
                        "201": {
                            "description": "Stored (or replayed, see Idempotent-Replayed).",
                            "headers": {**location, **replayed},
                            "content": {"application/json": {"schema": "Memory"}},
                        },
                        "400": error(
                            "Malformed JSON (MALFORMED_JSON) or header (INVALID_HEADER, "
                            "ORG_REQUIRED)."
                        ),
                        "409": error(
                            "IDEMPOTENCY_CONFLICT (the key was used with another body), "
                            "IDEMPOTENCY_IN_PROGRESS (with Retry-After) or DUPLICATE_CONTENT "
                            "(with existing_id). A stored 409 is replayed with "
                            "Idempotent-Replayed.",
                            **RETRY_AFTER,
                            **replayed,
                        ),
                        "413": error(f"Body over {max_body_bytes} bytes (BODY_TOO_LARGE)."),
                        "422": error(
                            "Validation failed, field by field (VALIDATION_FAILED); also an "
                            "agent_id, source.session_id or user_id that is not of this org, "
                            "a user_id that is not the source session's user, or a supersedes "
                            "id that is not a current memory of the same agent and user."
                        ),
                    }
                ),
            },
            "get": {
                "operationId": "listMemories",
                "summary": "List memories, newest first, with cursor pagination.",
                "security": secured,
                "parameters": [ORG_HEADER, {"in": "query", "schema": MemoryListQuerySchema}],
                "responses": with_org_errors(
                    {
                        "200": {
                            "description": "One page.",
                            "content": {"application/json": {"schema": "MemoryPage"}},
                        },
                        "400": error(
                            "A cursor this service did not issue (INVALID_CURSOR), or a "
                            "malformed X-IBEX-Org-ID (INVALID_HEADER) or none with a service "
                            "token (ORG_REQUIRED)."
                        ),
                        "404": UNKNOWN_AGENT,
                        "422": error("Invalid query parameter (VALIDATION_FAILED)."),
                    }
                ),
            },
        },
    )
    spec.path(
        path="/v1/memories/{memory_id}",
        operations={
            "get": {
                "operationId": "getMemory",
                "summary": "One memory of the org, if it is in the reader's user scope (the"
                " user's or agent-wide; without a user, agent-wide only).",
                "security": secured,
                "parameters": [
                    MEMORY_ID,
                    ORG_HEADER,
                    {"in": "query", "schema": MemoryReadQuerySchema},
                ],
                "responses": with_org_errors(
                    {
                        "200": {
                            "description": "The memory.",
                            "content": {"application/json": {"schema": "Memory"}},
                        },
                        "404": error("No such memory in this org, or another user's (NOT_FOUND)."),
                        "422": error("Invalid query parameter (VALIDATION_FAILED)."),
                    }
                ),
            },
            "delete": {
                "operationId": "deleteMemory",
                "summary": "Soft-delete a memory; its content may be written again. A token"
                " deletes only what it can read: a person's memory needs that person's"
                " token, the person named in the query (user), or the memory:admin scope;"
                " a user-bound token deletes its user's own memories only. Anything else is"
                " 404, as an unknown id.",
                "security": secured,
                "parameters": [
                    MEMORY_ID,
                    ORG_HEADER,
                    {"in": "query", "schema": MemoryDeleteQuerySchema},
                ],
                "responses": with_org_errors(
                    {
                        "204": {"description": "Deleted."},
                        "404": error(
                            "No such memory in this org, or one this token cannot read (NOT_FOUND)."
                        ),
                        "422": error("Invalid query parameter (VALIDATION_FAILED)."),
                    }
                ),
            },
        },
    )
    spec.path(
        path="/v1/agents/{agent}",
        operations={
            "get": {
                "operationId": "getAgent",
                "summary": "One of the org's agents, by slug or id: its id is what the memory"
                " routes take. Any token of the org may ask.",
                "security": secured,
                "parameters": [
                    {
                        "in": "path",
                        "name": "agent",
                        "required": True,
                        "description": "The agent's slug, or its id.",
                        "schema": {"type": "string", "minLength": 1},
                    },
                    ORG_HEADER,
                ],
                "responses": with_org_errors(
                    {
                        "200": {
                            "description": "The agent.",
                            "content": {
                                "application/json": {
                                    "schema": {
                                        "type": "object",
                                        "required": ["id", "slug"],
                                        "additionalProperties": False,
                                        "properties": {
                                            "id": {"type": "string", "format": "uuid"},
                                            "slug": {"type": "string"},
                                        },
                                    }
                                }
                            },
                        },
                        "404": UNKNOWN_AGENT,
                    }
                ),
            },
        },
    )
    spec.path(
        path="/v1/memories/{memory_id}/history",
        operations={
            "get": {
                "operationId": "memoryHistory",
                "summary": "The supersession chain the memory belongs to, oldest first: the"
                " memories it replaced (with their superseded_by), it, and what replaced it.",
                "security": secured,
                "parameters": [
                    MEMORY_ID,
                    ORG_HEADER,
                    {"in": "query", "schema": MemoryReadQuerySchema},
                ],
                "responses": with_org_errors(
                    {
                        "200": {
                            "description": "The chain, oldest first.",
                            "content": {"application/json": {"schema": "MemoryHistory"}},
                        },
                        "404": error("No such memory in this org, or another user's (NOT_FOUND)."),
                        "422": error("Invalid query parameter (VALIDATION_FAILED)."),
                    }
                ),
            },
        },
    )
    _read_path(spec, secured, max_body_bytes)
    document_sessions(spec, secured, max_body_bytes)
    document_users(spec, secured)
    health = {"application/json": {"schema": "Health"}}
    spec.path(
        path="/healthz",
        operations={
            "get": {
                "operationId": "healthz",
                "summary": "The process is up.",
                "responses": {"200": {"description": "Up.", "content": health}},
            }
        },
    )
    spec.path(
        path="/readyz",
        operations={
            "get": {
                "operationId": "readyz",
                "summary": "Postgres and Redis answer and the schema is current; details say"
                " why not, and the search mode.",
                "responses": {
                    "200": {"description": "Ready.", "content": health},
                    "503": {
                        "description": "A dependency does not answer, or the database is not"
                        " migrated (details.schema says what to run).",
                        "content": health,
                    },
                },
            }
        },
    )
    spec.path(
        path="/metrics",
        operations={
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics (no token; no tenant data in any label).",
                "description": "Request counts by route, method and status, latency "
                "histograms by route and method, idempotent replays, and conflicts by code; "
                "summed over every worker process when PROMETHEUS_MULTIPROC_DIR is set. "
                "The series are listed in docs/operations.md.",
                "responses": {
                    "200": {
                        "description": "Prometheus text exposition format.",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
    )
    spec.path(
        path="/openapi.json",
        operations={
            "get": {
                "operationId": "openapi",
                "summary": "This document.",
                "responses": {
                    "200": {
                        "description": "OpenAPI 3 document.",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    }
                },
            }
        },
    )
    document = finish_sessions(null_only_alternatives(spec.to_dict()))
    if embedding is not None:
        model, dimension = embedding
        vector = document["components"]["schemas"]["MemoryEmbedding"]["properties"]
        vector["model"]["enum"] = [model]
        vector["vector"]["minItems"] = vector["vector"]["maxItems"] = dimension
    return document


def _read_path(spec: APISpec, secured: list[dict[str, list[str]]], max_body_bytes: int) -> None:
    """``POST /v1/memories/search`` and ``POST /v1/context``."""
    for path, operation_id, summary, request, result, ok in (
        (
            "/v1/memories/search",
            "searchMemories",
            "Rank an agent's memories for a query (full-text fused with trigram similarity "
            "where pg_trgm is installed and with semantic similarity where an embedder is "
            "configured, the scope's nearest memories by meaning admitted by rank; recency "
            "breaks ties). Each hit has its score, the signals behind it and a highlighted "
            "snippet; min_score keeps the hits that score at least that.",
            "SearchRequest",
            "SearchResult",
            "The hits, best first (at most limit).",
        ),
        (
            "/v1/context",
            "assembleContext",
            "The person's standing facts (chosen without the query; all of their memories "
            "when they fit), then the memories relevant to a query or to the last messages, "
            "packed into a token budget as a <memories> block for a system prompt.",
            "ContextRequest",
            "ContextResult",
            "The block, the memories in it, its estimated tokens and how many were left out.",
        ),
    ):
        spec.path(
            path=path,
            operations={
                "post": {
                    "operationId": operation_id,
                    "summary": summary,
                    "security": secured,
                    "parameters": [ORG_HEADER],
                    "requestBody": {
                        "required": True,
                        "description": f"At most {max_body_bytes} bytes.",
                        "content": {"application/json": {"schema": request}},
                    },
                    "responses": with_org_errors(
                        {
                            "200": {
                                "description": ok,
                                "content": {"application/json": {"schema": result}},
                            },
                            "400": error(
                                "Malformed JSON (MALFORMED_JSON) or header (INVALID_HEADER, "
                                "ORG_REQUIRED)."
                            ),
                            "404": error(
                                "The agent (agent, a slug, or agent_id) is not one of the "
                                "org's (UNKNOWN_AGENT)."
                            ),
                            "413": error(f"Body over {max_body_bytes} bytes (BODY_TOO_LARGE)."),
                            "422": error(
                                "Validation failed, field by field (VALIDATION_FAILED); also "
                                "neither or both of agent and agent_id."
                            ),
                        }
                    ),
                }
            },
        )
