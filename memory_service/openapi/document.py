"""The OpenAPI 3 document of the service, generated from the marshmallow schemas (apispec).

Every route, every status code it can answer and every body, including the error body, is
listed; a test walks the app's routes and checks nothing is missing. Each domain's routes are
described beside their endpoints (``memory_service/memories/openapi.py``,
``memory_service/search/openapi.py``, ``memory_service/sessions/openapi.py``,
``memory_service/users/openapi.py``); this module assembles them with the process's own
routes (agents, health, metrics, this document).
"""

from __future__ import annotations

from typing import Any

from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin

from memory_service.memories.openapi import document as document_memories
from memory_service.memories.openapi import pin_embedding
from memory_service.openapi.parts import (
    ORG_HEADER,
    UNKNOWN_AGENT,
    null_only_alternatives,
    with_org_errors,
)
from memory_service.search.openapi import document as document_search
from memory_service.sessions.openapi import document as document_sessions
from memory_service.sessions.openapi import finish as finish_sessions
from memory_service.usage.openapi import document as document_usage
from memory_service.users.openapi import document as document_users
from schema.memory import ERROR_CODES, ErrorSchema, HealthSchema

TITLE = "IBEX memory service"
VERSION = "1.0.0"


def build_spec(max_body_bytes: int, embedding: tuple[str, int] | None = None) -> dict[str, Any]:
    """The document: each domain's routes described beside its endpoints
    (``memory_service/*/openapi.py``), and the process's own (agents, health, metrics, this
    document). ``embedding``: the (model, dimension) of the service's embedder, the only
    vectors a write may carry (without one a vector is accepted and not stored)."""
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
    spec.components.schema("Error", schema=ErrorSchema)
    spec.components.schema("Health", schema=HealthSchema)
    secured: list[dict[str, list[str]]] = [{"bearer": []}]
    document_memories(spec, secured, max_body_bytes)
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
    document_search(spec, secured, max_body_bytes)
    document_sessions(spec, secured, max_body_bytes)
    document_users(spec, secured)
    document_usage(spec, secured)
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
    pin_embedding(document, embedding)
    malformed_ids(document)
    return document


ERROR_SCHEMA = "#/components/schemas/Error"


def malformed_ids(document: dict[str, Any]) -> None:
    """Every operation of a path with an id in it (``/v1/sessions/{session_id}``) also answers
    400 ``MALFORMED_ID`` for an id that is not a UUID (a typo is not an unknown object)."""
    note = "an id in the path that is not a UUID (MALFORMED_ID)."
    for path, operations in document["paths"].items():
        if not path.startswith(("/v1/sessions/{", "/v1/memories/{")):
            continue
        for operation in operations.values():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            answer = operation["responses"].get("400")
            if answer is None:
                operation["responses"]["400"] = {
                    "description": note[0].upper() + note[1:],
                    "content": {"application/json": {"schema": {"$ref": ERROR_SCHEMA}}},
                }
            elif "MALFORMED_ID" not in answer.get("description", ""):
                answer["description"] = f"{answer['description'].rstrip()} Or {note}"
