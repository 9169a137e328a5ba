"""The OpenAPI description of the memories routes (``/v1/memories``, ``/v1/memories/{id}``
and its history), beside their endpoints: their schemas, parameters and answers."""

from __future__ import annotations

from typing import Any

from apispec import APISpec

from memory_service.openapi.parts import (
    ONE_USER,
    ORG_HEADER,
    PRINTABLE_HEADER_PATTERN,
    RETRY_AFTER,
    UNKNOWN_AGENT,
    error,
    with_org_errors,
)
from schema.memory import (
    MAX_IDEMPOTENCY_KEY_CHARS,
    MemoryCreateSchema,
    MemoryDeleteQuerySchema,
    MemoryHistorySchema,
    MemoryListQuerySchema,
    MemoryPageSchema,
    MemoryReadQuerySchema,
    MemorySchema,
)

MEMORY_ID = {
    "in": "path",
    "name": "memory_id",
    "required": True,
    "schema": {"type": "string", "format": "uuid"},
}


def document(spec: APISpec, secured: list[dict[str, list[str]]], max_body_bytes: int) -> None:
    """Add the memories routes and their schemas to ``spec``."""
    for name, schema in (
        ("Memory", MemorySchema),
        ("MemoryPage", MemoryPageSchema),
        ("MemoryHistory", MemoryHistorySchema),
    ):
        spec.components.schema(name, schema=schema)
    spec.components.schema("MemoryCreate", component=ONE_USER, schema=MemoryCreateSchema)
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


def pin_embedding(document: dict[str, Any], embedding: tuple[str, int] | None) -> None:
    """State the only vectors a write may carry: the service's embedder's (model,
    dimension); without one a vector is accepted and not stored."""
    if embedding is None:
        return
    model, dimension = embedding
    vector = document["components"]["schemas"]["MemoryEmbedding"]["properties"]
    vector["model"]["enum"] = [model]
    vector["vector"]["minItems"] = vector["vector"]["maxItems"] = dimension
