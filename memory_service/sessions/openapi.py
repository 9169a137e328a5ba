"""The OpenAPI description of the sessions API (:mod:`memory_service.sessions`): its schemas,
routes, status codes and headers, added to the service's document by
:func:`memory_service.openapi.document.build_spec`.
"""

from __future__ import annotations

from typing import Any

from apispec import APISpec

from memories.scope import USER_HEADER
from memory_service.openapi.parts import (
    ONE_USER,
    ORG_HEADER,
    PRINTABLE_HEADER_PATTERN,
    UNKNOWN_AGENT,
    error,
    exactly_one_of,
    with_org_errors,
)
from memory_service.sessions.endpoints import SESSION_HEADER
from schema.imports import FORBIDDEN_FREE_PATTERN
from schema.sessions import (
    MAX_EXTERNAL_ID_CHARS,
    SessionCreateSchema,
    SessionListQuerySchema,
    SessionPageSchema,
    SessionSchema,
    TurnListQuerySchema,
    TurnPageSchema,
    TurnsAppendedSchema,
    TurnsAppendSchema,
)
from schema.users import MAX_USER_KEY_CHARS

SESSION_ID = {
    "in": "path",
    "name": "session_id",
    "required": True,
    "schema": {"type": "string", "format": "uuid"},
}


#: Any JSON value whose strings hold no control character but tab, newline and carriage
#: return: what a turn's message carries besides its role (``check_strings``). Keys of its
#: objects are held to the same rule, which OpenAPI 3.0 cannot state (no ``propertyNames``).
TURN_VALUE = {
    "nullable": True,
    "anyOf": [
        {"type": "string", "pattern": FORBIDDEN_FREE_PATTERN},
        {"type": "number"},
        {"type": "boolean"},
        {"type": "array", "items": {"$ref": "#/components/schemas/TurnValue"}},
        {"type": "object", "additionalProperties": {"$ref": "#/components/schemas/TurnValue"}},
    ],
}


def finish(document: dict[str, Any]) -> dict[str, Any]:
    """The document with a message's content and extra keys held to :data:`TURN_VALUE`."""
    schemas = document["components"]["schemas"]
    schemas["TurnValue"] = TURN_VALUE
    message = schemas["Message"]
    message["additionalProperties"] = {"$ref": "#/components/schemas/TurnValue"}
    message["properties"]["content"] = {
        "nullable": True,
        "anyOf": [
            {"type": "string", "pattern": FORBIDDEN_FREE_PATTERN},
            {"type": "array", "items": {"$ref": "#/components/schemas/TurnValue"}},
        ],
    }
    return document


def document(spec: APISpec, secured: list[dict[str, list[str]]], max_body_bytes: int) -> None:
    """Add the sessions API's schemas and routes to ``spec``."""
    # The rule the schema's validator enforces, which its fields cannot say.
    spec.components.schema(
        "SessionCreate",
        component={"allOf": [exactly_one_of(agent="string", agent_id="string"), ONE_USER]},
        schema=SessionCreateSchema,
    )
    for name, schema in (
        ("Session", SessionSchema),
        ("SessionPage", SessionPageSchema),
        ("TurnsAppend", TurnsAppendSchema),
        ("TurnsAppended", TurnsAppendedSchema),
        ("TurnPage", TurnPageSchema),
    ):
        spec.components.schema(name, schema=schema)

    def body(schema: str) -> dict[str, Any]:
        return {
            "required": True,
            "description": f"At most {max_body_bytes} bytes (MEMORY_MAX_BODY_BYTES).",
            "content": {"application/json": {"schema": schema}},
        }

    def ok(description: str, schema: str, **headers: Any) -> dict[str, Any]:
        answer: dict[str, Any] = {
            "description": description,
            "content": {"application/json": {"schema": schema}},
        }
        if headers:
            answer["headers"] = headers
        return answer

    bad_body = {
        "400": error("Malformed JSON (MALFORMED_JSON) or header (INVALID_HEADER, ORG_REQUIRED)."),
        "413": error(f"Body over {max_body_bytes} bytes (BODY_TOO_LARGE)."),
        "422": error("Validation failed, field by field (VALIDATION_FAILED)."),
    }
    missing = {
        "404": error(
            "No such live session in this org, or another user's for a user-bound token"
            " (NOT_FOUND)."
        )
    }
    replayed = {
        "Idempotent-Replayed": {
            "description": "`true` when every turn was already stored (nothing was written).",
            "schema": {"type": "string", "enum": ["true"]},
        }
    }
    location = {"Location": {"description": "The session.", "schema": {"type": "string"}}}
    spec.path(
        path="/v1/sessions",
        operations={
            "post": {
                "operationId": "openSession",
                "summary": "Open a session, or find the one with this external id.",
                "description": "The agent is the slug of one of the org's agents (an unknown "
                "slug is 404 UNKNOWN_AGENT, unless create_agent is true: then it is created) or "
                "an agent_id of the org. The same (agent, external_id) again answers 200 with "
                "the existing session; without an external id a new session is opened every time.",
                "security": secured,
                "parameters": [
                    ORG_HEADER,
                    {
                        "in": "header",
                        "name": SESSION_HEADER,
                        "required": False,
                        "description": "The external id, instead of (or equal to) the "
                        "body's external_id: printable characters (else 400 INVALID_HEADER).",
                        "schema": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": MAX_EXTERNAL_ID_CHARS,
                            "pattern": PRINTABLE_HEADER_PATTERN,
                        },
                    },
                    {
                        "in": "header",
                        "name": USER_HEADER,
                        "required": False,
                        "description": "The user's key (created when missing), instead of (or"
                        " equal to) the body's user.",
                        "schema": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": MAX_USER_KEY_CHARS,
                        },
                    },
                ],
                "requestBody": body("SessionCreate"),
                "responses": with_org_errors(
                    {
                        "201": ok("Opened.", "Session", **location),
                        "200": ok("The session with this external id.", "Session", **location),
                        **bad_body,
                        "404": UNKNOWN_AGENT,
                        "409": error(
                            "The session with this external id was deleted (SESSION_DELETED),"
                            " or has another user (USER_CONFLICT: a session's user is set"
                            " once)."
                        ),
                        "422": error(
                            "Validation failed, field by field (VALIDATION_FAILED); also a "
                            "user_id that is not of this org."
                        ),
                    }
                ),
            },
            "get": {
                "operationId": "listSessions",
                "summary": "List live sessions with their progress, newest first, with cursor "
                "pagination.",
                "security": secured,
                "parameters": [ORG_HEADER, {"in": "query", "schema": SessionListQuerySchema}],
                "responses": with_org_errors(
                    {
                        "200": ok("One page.", "SessionPage"),
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
    one = "/v1/sessions/{session_id}"
    spec.path(
        path=one,
        operations={
            "get": {
                "operationId": "getSession",
                "summary": "One session with its extraction progress (turns done, pending, "
                "failed; the pointer).",
                "security": secured,
                "parameters": [SESSION_ID, ORG_HEADER],
                "responses": with_org_errors({"200": ok("The session.", "Session"), **missing}),
            },
            "delete": {
                "operationId": "deleteSession",
                "summary": "Soft-delete the session and every memory whose source it is, in "
                "one transaction.",
                "description": "Needs the scopes sessions:write and memory:write (it deletes "
                "memories): a token without either is 403 INSUFFICIENT_SCOPE.",
                "security": secured,
                "parameters": [SESSION_ID, ORG_HEADER],
                "responses": with_org_errors({"204": {"description": "Deleted."}, **missing}),
            },
        },
    )
    spec.path(
        path=f"{one}/turns",
        operations={
            "get": {
                "operationId": "listTurns",
                "summary": "The session's turns in order, each as recorded with its extraction "
                "state and usage, with cursor pagination.",
                "description": "state is one of pending, extracting, extracted, empty, "
                "waiting_for_budget, failed (reason: the failure's class; it will be retried) "
                "and dead_lettered (reason: the failure's class; `ibex dlq replay` sends it "
                "again). usage is null until the turn's result is persisted; it is counted "
                "once, whatever the retries, and cost is in USD by the price table.",
                "security": secured,
                "parameters": [
                    SESSION_ID,
                    ORG_HEADER,
                    {"in": "query", "schema": TurnListQuerySchema},
                ],
                "responses": with_org_errors(
                    {
                        "200": ok("One page.", "TurnPage"),
                        "400": error(
                            "A cursor this service did not issue (INVALID_CURSOR), or a "
                            "malformed X-IBEX-Org-ID (INVALID_HEADER) or none with a service "
                            "token (ORG_REQUIRED)."
                        ),
                        **missing,
                        "422": error("Invalid query parameter (VALIDATION_FAILED)."),
                    }
                ),
            },
            "post": {
                "operationId": "appendTurns",
                "summary": "Append consecutive turns in one transaction; safe to retry.",
                "description": "Turns already stored with the same content are a no-op; "
                "another content is TURN_CONFLICT (turns are immutable); a first turn_index "
                "past turn_count + 1 is TURN_GAP with expected_turn_index. No string and no "
                "key anywhere in a turn (a message's extra keys included) may hold a control "
                "character other than tab, newline and carriage return (422).",
                "security": secured,
                "parameters": [SESSION_ID, ORG_HEADER],
                "requestBody": body("TurnsAppend"),
                "responses": with_org_errors(
                    {
                        "201": ok("Appended (turns_added > 0).", "TurnsAppended"),
                        "200": ok(
                            "Every turn was already stored: nothing written.",
                            "TurnsAppended",
                            **replayed,
                        ),
                        **bad_body,
                        **missing,
                        "409": error(
                            "A turn differs from the stored one (TURN_CONFLICT, with "
                            "turn_index), or turns would be skipped (TURN_GAP, with "
                            "expected_turn_index)."
                        ),
                    }
                ),
            },
        },
    )
    for action, operation_id, summary in (
        (
            "complete",
            "completeSession",
            "Mark the session completed (idempotent): the next scan extracts its turns.",
        ),
        (
            "abandon",
            "abandonSession",
            "Mark the session abandoned (idempotent): it is never extracted.",
        ),
    ):
        spec.path(
            path=f"{one}/{action}",
            operations={
                "post": {
                    "operationId": operation_id,
                    "summary": summary,
                    "security": secured,
                    "parameters": [SESSION_ID, ORG_HEADER],
                    "responses": with_org_errors({"200": ok("The session.", "Session"), **missing}),
                }
            },
        )
