"""Payloads of the memory service: requests, responses and error bodies.

The service validates with these schemas and ``/openapi.json`` is generated from them, so the
document cannot drift from what the code accepts. No I/O here.
"""

from __future__ import annotations

import json
import math
from typing import Any

from marshmallow import RAISE, Schema, ValidationError, fields, validate, validates_schema

from schema.common import StrictInteger
from schema.users import (
    UserReadFields,
    check_one_user,
    user_field,
)

#: Mirrors the CHECK on ``ibex_memory.memories.kind`` (a unit test keeps them in step).
MEMORY_KINDS = ("fact", "preference", "event", "other")
SCOPES = (
    "memory:read",
    "memory:write",
    "sessions:read",
    "sessions:write",
    "memory:admin",
    "users:delete",
    "usage:read",
)
MAX_CONTENT_CHARS = 4000
MAX_METADATA_BYTES = 16384
MAX_METADATA_DEPTH = 16
MAX_IDEMPOTENCY_KEY_CHARS = 255
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
MAX_CURSOR_CHARS = 512
#: Memories one new memory may supersede at once.
MAX_SUPERSEDES = 20
#: What a write does with an id of ``supersedes`` that is no longer current.
STALE_SUPERSEDES = ("reject", "skip")

#: Every error code the service answers with; documented in the OpenAPI error schema.
ERROR_CODES = (
    "MALFORMED_JSON",
    "MALFORMED_ID",
    "INVALID_HEADER",
    "ORG_REQUIRED",
    "UNAUTHORIZED",
    "INSUFFICIENT_SCOPE",
    "FORBIDDEN_ORG",
    "NOT_FOUND",
    "METHOD_NOT_ALLOWED",
    "IDEMPOTENCY_CONFLICT",
    "IDEMPOTENCY_IN_PROGRESS",
    "DUPLICATE_CONTENT",
    "BODY_TOO_LARGE",
    "VALIDATION_FAILED",
    "INVALID_CURSOR",
    "TURN_CONFLICT",
    "TURN_GAP",
    "SESSION_DELETED",
    "USER_CONFLICT",
    "FORBIDDEN_USER",
    "BAD_REQUEST",
    "URI_TOO_LONG",
    "HEADERS_TOO_LARGE",
    "REQUEST_TIMEOUT",
    "EXPECTATION_FAILED",
    "FORBIDDEN",
    "INTERNAL_ERROR",
    "UNAVAILABLE",
    "SCHEMA_NOT_READY",
    "UNKNOWN_AGENT",
)


#: What :func:`_storable_text` and :func:`_content_valid` accept, as OpenAPI patterns: no NUL;
#: and for a text that must not be blank, some non-space character. (Lone surrogates, also
#: refused, are not Unicode text: JSON Schema strings cannot hold them.)
STORABLE_PATTERN = r"^[^\x00]*$"
NOT_BLANK_PATTERN = r"^[^\x00]*[^\s\x00][^\x00]*$"


def _storable_text(text: str) -> None:
    """Postgres text cannot hold NUL, and UTF-8 cannot encode lone surrogates."""
    if "\x00" in text:
        raise ValidationError("must not contain NUL characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError("must be valid Unicode (no lone surrogates)") from None


def _check_json_value(value: Any, depth: int) -> None:
    if depth > MAX_METADATA_DEPTH:
        raise ValidationError(f"must not nest deeper than {MAX_METADATA_DEPTH} levels")
    if isinstance(value, str):
        _storable_text(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValidationError("keys must be strings")
            _storable_text(key)
            _check_json_value(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_json_value(item, depth + 1)
    elif isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValidationError("numbers must be finite")
    elif value is not None and not isinstance(value, bool | int):
        raise ValidationError("must be plain JSON")


def _metadata_valid(value: dict[str, Any]) -> None:
    _check_json_value(value, 1)
    size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
    if size > MAX_METADATA_BYTES:
        raise ValidationError(f"must be at most {MAX_METADATA_BYTES} bytes as JSON")


def _content_valid(text: str) -> None:
    _storable_text(text)
    if not text.split():
        raise ValidationError("must not be blank")


# The paging fields every list route shares (memories, sessions): one definition each.


#: The OpenAPI ``format`` of a cursor: a value only the service makes (``next_cursor``).
CURSOR_FORMAT = "ibex-cursor"


def next_cursor_field() -> fields.String:
    """``next_cursor`` of a page answer."""
    return fields.String(
        required=True,
        allow_none=True,
        metadata={"description": "Pass as `cursor` for the next page; null on the last page."},
    )


def page_limit_field() -> fields.Integer:
    """``limit`` of a list query."""
    return fields.Integer(
        load_default=DEFAULT_PAGE_SIZE, validate=validate.Range(min=1, max=MAX_PAGE_SIZE)
    )


def page_cursor_field() -> fields.String:
    """``cursor`` of a list query."""
    return fields.String(
        validate=validate.Length(min=1, max=MAX_CURSOR_CHARS),
        metadata={
            "description": "Opaque; the `next_cursor` of the previous page, as it was given "
            "(anything else is 400 INVALID_CURSOR).",
            "format": CURSOR_FORMAT,
        },
    )


class MemorySourceSchema(Schema):
    """Where the memory was extracted from: one ordinal of one turn of a session."""

    class Meta:
        unknown = RAISE

    session_id = fields.UUID(required=True)
    turn_index = StrictInteger(
        load_default=None, allow_none=True, validate=validate.Range(min=1, max=2**31 - 1)
    )
    ordinal = StrictInteger(
        load_default=None, allow_none=True, validate=validate.Range(min=0, max=2**31 - 1)
    )


#: The widest vector accepted with a memory (core.config.MAX_EMBEDDING_DIMENSION).
MAX_EMBEDDING_DIMENSION = 4096
MAX_EMBEDDING_MODEL_CHARS = 200


def embedding_vector_valid(vector: list[float]) -> None:
    """Finite numbers only (JSON has no NaN, but Python's parser takes one)."""
    if not all(math.isfinite(v) for v in vector):
        raise ValidationError("must hold finite numbers only")


class FiniteFloat(fields.Float):
    """A JSON number, never a boolean or a string of digits."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValidationError("Not a valid number.")
        return float(value)


class MemoryEmbeddingSchema(Schema):
    """A memory's vector, computed by the writer (the pipeline embeds a turn's memories once)."""

    class Meta:
        unknown = RAISE

    model = fields.String(
        required=True,
        validate=validate.Length(min=1, max=MAX_EMBEDDING_MODEL_CHARS),
        metadata={
            "description": "The embedder that made the vector, e.g."
            " local:wordllama-l2_supercat-256; search compares only vectors of its own model."
        },
    )
    vector = fields.List(
        FiniteFloat(),
        required=True,
        validate=[
            validate.Length(min=1, max=MAX_EMBEDDING_DIMENSION),
            embedding_vector_valid,
        ],
        metadata={"description": "The vector (normalised to unit length when stored)."},
    )


class MemoryCreateSchema(Schema):
    """Body of ``POST /v1/memories``."""

    class Meta:
        unknown = RAISE

    agent_id = fields.UUID(required=True, metadata={"description": "An agent of the org."})
    content = fields.String(
        required=True,
        validate=[validate.Length(min=1, max=MAX_CONTENT_CHARS), _content_valid],
        metadata={
            "description": "The memory. Deduplicated per org and agent after NFKC, case "
            "folding and whitespace collapsing.",
            "pattern": NOT_BLANK_PATTERN,
        },
    )
    kind = fields.String(load_default="fact", validate=validate.OneOf(MEMORY_KINDS))
    source = fields.Nested(MemorySourceSchema, load_default=None, allow_none=True)
    metadata = fields.Dict(
        keys=fields.String(),
        values=fields.Raw(allow_none=True),
        load_default=dict,
        validate=_metadata_valid,
        metadata={
            "description": f"Free-form JSON object, at most {MAX_METADATA_BYTES} bytes, nested "
            f"at most {MAX_METADATA_DEPTH} levels; no NUL in any key or string."
        },
    )
    user = user_field(writes=True)
    user_id = fields.UUID(
        allow_none=True,
        metadata={
            "description": "The user of the org the memory is about (or give user); none:"
            " agent-wide. A memory whose source session has a user must carry that user (422"
            " otherwise). A user-bound token's memories are its user's."
        },
    )
    supersedes = fields.List(
        fields.UUID(),
        validate=validate.Length(max=MAX_SUPERSEDES),
        metadata={
            "description": "Current memories of the same agent and user that this memory"
            " replaces: they are marked superseded (superseded_by, superseded_at) in the same"
            " transaction as the insert, never deleted. An id that is not a current memory of"
            " that scope: 422 (see stale_supersedes)."
        },
    )
    stale_supersedes = fields.String(
        validate=validate.OneOf(STALE_SUPERSEDES),
        metadata={
            "description": "`reject` (the default): an id of `supersedes` that is no longer"
            " current (superseded already, deleted, or erased) refuses the write with 422."
            " `skip`: that mark is skipped and the memory is stored (what the pipeline sends:"
            " its decision was taken earlier). An id of another agent or user is 422 either"
            " way."
        },
    )

    embedding = fields.Nested(
        MemoryEmbeddingSchema,
        metadata={
            "description": "Optional: the memory's vector, stored with it in the same"
            " transaction. Not part of the idempotency fingerprint. Without it the service"
            " embeds the memory itself after storing it (when an embedder is configured)."
        },
    )

    @validates_schema
    def _one_user(self, data: dict[str, Any], **kwargs: Any) -> None:
        check_one_user(data)


class MemorySchema(Schema):
    """A stored memory, as every read and write returns it."""

    class Meta:
        unknown = RAISE

    id = fields.UUID(required=True)
    org_id = fields.UUID(required=True)
    agent_id = fields.UUID(required=True)
    content = fields.String(required=True)
    content_hash = fields.String(
        required=True,
        validate=validate.Regexp(r"^[0-9a-f]{64}$"),
        metadata={"description": "SHA-256 (hex) of the normalised content."},
    )
    kind = fields.String(required=True, validate=validate.OneOf(MEMORY_KINDS))
    source = fields.Nested(MemorySourceSchema, required=True, allow_none=True)
    metadata = fields.Dict(keys=fields.String(), values=fields.Raw(allow_none=True), required=True)
    user_id = fields.UUID(
        required=True,
        allow_none=True,
        metadata={"description": "Whose memory it is; null: agent-wide (shared by everyone)."},
    )
    created_at = fields.AwareDateTime(required=True)
    valid_from = fields.AwareDateTime(
        required=True, metadata={"description": "Since when the fact holds (its creation)."}
    )
    superseded_by = fields.UUID(
        required=True,
        allow_none=True,
        metadata={
            "description": "The memory that replaced this one; null: current. A 201 shows the"
            " memory as created (null)."
        },
    )
    superseded_at = fields.AwareDateTime(required=True, allow_none=True)


class MemoryPageSchema(Schema):
    """One page of ``GET /v1/memories``, newest first."""

    class Meta:
        unknown = RAISE

    items = fields.List(fields.Nested(MemorySchema), required=True)
    next_cursor = next_cursor_field()


class MemoryListQuerySchema(UserReadFields):
    """Query parameters of ``GET /v1/memories``."""

    class Meta:
        unknown = RAISE

    agent_id = fields.UUID()
    session_id = fields.UUID()
    limit = page_limit_field()
    cursor = page_cursor_field()
    include_superseded = fields.Boolean(
        load_default=False,
        metadata={"description": "Also list superseded memories (with their superseded_by)."},
    )


class MemoryReadQuerySchema(UserReadFields):
    """Query parameters of ``GET /v1/memories/{id}`` and its history: whose memories the read
    may return."""

    class Meta:
        unknown = RAISE


class MemoryDeleteQuerySchema(Schema):
    """Query parameter of ``DELETE /v1/memories/{id}``: the person whose memory it is, for a
    token that is not theirs (a token deletes only what it can read)."""

    class Meta:
        unknown = RAISE

    user = user_field()


class MemoryHistorySchema(Schema):
    """``GET /v1/memories/{id}/history``: the supersession chain, oldest first."""

    class Meta:
        unknown = RAISE

    items = fields.List(fields.Nested(MemorySchema), required=True)


class ErrorDetailSchema(Schema):
    class Meta:
        unknown = RAISE

    code = fields.String(required=True, validate=validate.OneOf(ERROR_CODES))
    message = fields.String(required=True)
    fields_ = fields.Dict(
        data_key="fields",
        keys=fields.String(),
        values=fields.Raw(),
        metadata={"description": "422 only: the errors field by field."},
    )
    existing_id = fields.UUID(
        metadata={
            "description": "DUPLICATE_CONTENT: the memory that holds this content. "
            "IDEMPOTENCY_CONFLICT: the memory stored under this key, when known."
        }
    )
    retry_after = fields.Integer(metadata={"description": "Seconds, as in Retry-After."})
    turn_index = fields.Integer(
        metadata={"description": "TURN_CONFLICT: the stored turn the request differs from."}
    )
    expected_turn_index = fields.Integer(
        metadata={"description": "TURN_GAP: the index the session's next turn must have."}
    )

    @validates_schema
    def _known_shape(self, data: dict[str, Any], **kwargs: Any) -> None:
        if data.get("code") == "DUPLICATE_CONTENT" and "existing_id" not in data:
            raise ValidationError("DUPLICATE_CONTENT names existing_id", "existing_id")
        if data.get("code") == "TURN_GAP" and "expected_turn_index" not in data:
            raise ValidationError("TURN_GAP names expected_turn_index", "expected_turn_index")


class ErrorSchema(Schema):
    """Every error: ``{"error": {"code", "message", ...}}``."""

    class Meta:
        unknown = RAISE

    error = fields.Nested(ErrorDetailSchema, required=True)


class HealthSchema(Schema):
    class Meta:
        unknown = RAISE

    status = fields.String(required=True, validate=validate.OneOf(("ok", "unavailable")))
    checks = fields.Dict(keys=fields.String(), values=fields.String())
    details = fields.Dict(
        keys=fields.String(),
        values=fields.String(),
        metadata={
            "description": "Why a check failed when it says more than the error's name (`schema`:"
            " what to run), and `search`: `full-text+trigram`, or `full-text` where Postgres"
            " lacks the pg_trgm extension."
        },
    )
