"""Payloads of the sessions API: create, append turns, list, and the session it returns.

A turn is validated exactly as a line of ``ibex import`` validates it (the same message and
turn schemas, the same character and nesting rules), so a conversation fed over HTTP is stored
with the same content and hashes as the same conversation imported. No I/O here.
"""

from __future__ import annotations

from typing import Any

from marshmallow import RAISE, Schema, ValidationError, fields, validate, validates_schema

from core.errors import InvalidMessageError
from schema.common import Slug, StrictInteger
from schema.imports import (
    FORBIDDEN_FREE_PATTERN,
    MAX_DEPTH,
    MAX_INT32,
    SESSION_STATUSES,
    TurnSchema,
    check_strings,
)
from schema.memory import (
    MAX_CURSOR_CHARS,
    next_cursor_field,
    page_cursor_field,
    page_limit_field,
)
from schema.users import check_one_user, user_field, user_id_field

MAX_EXTERNAL_ID_CHARS = 255
#: Turns in one append request.
MAX_TURNS_PER_REQUEST = 1000


def _depth(value: Any) -> int:
    """How deeply objects and arrays nest in ``value`` (a scalar is 0)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            stack.extend((inner, level + 1) for inner in item.values())
        elif isinstance(item, list):
            stack.extend((inner, level + 1) for inner in item)
        else:
            continue
        deepest = max(deepest, level + 1)
    return deepest


def _storable(text: str) -> None:
    """No control character (but tab, newline, carriage return) and no lone surrogate."""
    try:
        check_strings(text)
    except InvalidMessageError:
        raise ValidationError("must not hold control characters or lone surrogates") from None


class SessionCreateSchema(Schema):
    """Body of ``POST /v1/sessions``: the agent by slug or by id; an unknown slug is created
    only with ``create_agent``."""

    class Meta:
        unknown = RAISE

    agent = Slug(
        metadata={
            "description": "The agent's slug; 404 UNKNOWN_AGENT if the org has none, unless "
            "create_agent is true."
        }
    )
    create_agent = fields.Boolean(
        load_default=False,
        metadata={"description": "Create the agent named by agent when the org has none."},
    )
    agent_id = fields.UUID(metadata={"description": "An agent of the org (instead of agent)."})
    external_id = fields.String(
        load_default=None,
        allow_none=True,
        validate=[validate.Length(min=1, max=MAX_EXTERNAL_ID_CHARS), _storable],
        metadata={
            "description": "The client's id of the conversation: the same (agent, external_id) "
            "again returns the existing session. May come in X-IBEX-Session-ID instead.",
            "pattern": FORBIDDEN_FREE_PATTERN,
        },
    )
    model = fields.String(
        load_default=None,
        allow_none=True,
        validate=[validate.Length(max=200), _storable],
        metadata={"pattern": FORBIDDEN_FREE_PATTERN},
    )
    provider = fields.String(
        load_default=None,
        allow_none=True,
        validate=[validate.Length(max=200), _storable],
        metadata={"pattern": FORBIDDEN_FREE_PATTERN},
    )

    # Whose conversation (schema.users); may come in X-IBEX-User-ID instead. Set once.
    user = user_field(writes=True)
    user_id = user_id_field()

    @validates_schema
    def _one_agent(self, data: dict[str, Any], **kwargs: Any) -> None:
        if ("agent" in data) == ("agent_id" in data):
            raise ValidationError("give exactly one of agent (a slug) and agent_id", "agent")
        check_one_user(data)


class TurnAppendSchema(TurnSchema):
    """One turn of ``POST /v1/sessions/{id}/turns``: an import turn with its index."""

    turn_index = StrictInteger(required=True, validate=validate.Range(min=1, max=MAX_INT32))
    is_complete = fields.Boolean(load_default=True, truthy={True}, falsy={False})


class TurnsAppendSchema(Schema):
    """Body of ``POST /v1/sessions/{id}/turns``: consecutive turns, in order."""

    class Meta:
        unknown = RAISE

    turns = fields.List(
        fields.Nested(TurnAppendSchema),
        required=True,
        validate=validate.Length(min=1, max=MAX_TURNS_PER_REQUEST),
    )

    @validates_schema(skip_on_field_errors=True)
    def _consecutive_and_storable(self, data: dict[str, Any], **kwargs: Any) -> None:
        turns = data["turns"]
        errors: dict[int, dict[str, list[str]]] = {}
        for i, turn in enumerate(turns):
            if i and turn["turn_index"] != turns[i - 1]["turn_index"] + 1:
                errors[i] = {"turn_index": ["must follow the previous turn's index by one"]}
                continue
            content = {"messages": turn["messages"], "completion": turn["completion"]}
            # The same limit as an import line's, where a turn object is level 3 (in the
            # session object's turns array): a turn stored one way can be stored the other.
            if _depth(content) + 2 > MAX_DEPTH:
                errors[i] = {"_schema": [f"nested deeper than {MAX_DEPTH} levels"]}
                continue
            try:
                check_strings(content)
            except InvalidMessageError as exc:
                errors[i] = {"_schema": [str(exc)]}
        if errors:
            raise ValidationError({"turns": errors})


class ProgressSchema(Schema):
    class Meta:
        unknown = RAISE

    done = fields.Integer(required=True, metadata={"description": "Turns extracted."})
    pending = fields.Integer(
        required=True, metadata={"description": "Turns not yet extracted nor failed."}
    )
    failed = fields.Integer(
        required=True, metadata={"description": "Turns whose extraction was dead-lettered."}
    )
    pointer = fields.Integer(
        required=True,
        metadata={"description": "last_extracted_turn: every turn up to it is extracted."},
    )


class SessionSchema(Schema):
    """A session as every route returns it."""

    class Meta:
        unknown = RAISE

    id = fields.UUID(required=True)
    org_id = fields.UUID(required=True)
    agent_id = fields.UUID(required=True)
    external_id = fields.String(required=True, allow_none=True)
    user_id = fields.UUID(
        required=True,
        allow_none=True,
        metadata={"description": "Whose conversation; null: agent-wide. Set once."},
    )
    status = fields.String(required=True, validate=validate.OneOf(SESSION_STATUSES))
    model = fields.String(required=True, allow_none=True)
    provider = fields.String(required=True, allow_none=True)
    turn_count = fields.Integer(required=True)
    last_extracted_turn = fields.Integer(required=True)
    prompt_tokens = fields.Integer(required=True)
    completion_tokens = fields.Integer(required=True)
    progress = fields.Nested(ProgressSchema, required=True)
    created_at = fields.AwareDateTime(required=True)
    updated_at = fields.AwareDateTime(required=True)
    completed_at = fields.AwareDateTime(required=True, allow_none=True)


class TurnsAppendedSchema(Schema):
    """Answer of ``POST /v1/sessions/{id}/turns``."""

    class Meta:
        unknown = RAISE

    session = fields.Nested(SessionSchema, required=True)
    turns_added = fields.Integer(
        required=True, metadata={"description": "0 when every turn was already stored."}
    )


class SessionPageSchema(Schema):
    """One page of ``GET /v1/sessions``, newest first."""

    class Meta:
        unknown = RAISE

    items = fields.List(fields.Nested(SessionSchema), required=True)
    next_cursor = next_cursor_field()


class SessionListQuerySchema(Schema):
    """Query parameters of ``GET /v1/sessions``."""

    class Meta:
        unknown = RAISE

    agent_id = fields.UUID()
    external_id = fields.String(
        validate=[validate.Length(min=1, max=MAX_EXTERNAL_ID_CHARS), _storable],
        metadata={"pattern": FORBIDDEN_FREE_PATTERN},
    )
    status = fields.String(validate=validate.OneOf(SESSION_STATUSES))
    limit = page_limit_field()
    cursor = page_cursor_field()


#: A turn's extraction state (DESIGN §21), as ``ibex_core.turn_state`` computes it.
TURN_STATES = (
    "pending",
    "extracting",
    "extracted",
    "empty",
    "waiting_for_budget",
    "failed",
    "dead_lettered",
)
#: The turns list's cursor: its own format, not the memories list's (a turn index, not a
#: time and an id).
TURN_CURSOR_FORMAT = "ibex-turn-cursor"


class TurnUsageSchema(Schema):
    """What extracting one turn cost, counted once with its persisted result."""

    class Meta:
        unknown = RAISE

    llm_calls = fields.Integer(
        required=True,
        metadata={"description": "LLM calls counted for the turn (0: a repeated turn reused)."},
    )
    input_tokens = fields.Integer(required=True)
    output_tokens = fields.Integer(required=True)
    embedding_tokens = fields.Integer(required=True)
    latency_ms = fields.Integer(
        required=True, metadata={"description": "The LLM call's duration (0: no call)."}
    )
    provider = fields.String(required=True, allow_none=True)
    model = fields.String(required=True, allow_none=True)
    embedding_model = fields.String(required=True, allow_none=True)
    cost = fields.Float(
        required=True,
        metadata={"description": "USD, by the price table (0 for a model it does not price)."},
    )


class RecordedTurnSchema(Schema):
    """One turn as recorded, with where its extraction stands."""

    class Meta:
        unknown = RAISE

    turn_index = fields.Integer(required=True)
    messages = fields.List(fields.Dict(), required=True)
    completion = fields.Dict(required=True)
    state = fields.String(required=True, validate=validate.OneOf(TURN_STATES))
    reason = fields.String(
        required=True,
        allow_none=True,
        metadata={"description": "The failure's class when failed or dead_lettered, else null."},
    )
    memories = fields.Integer(
        required=True,
        allow_none=True,
        metadata={"description": "Memories extracted (null: no result yet)."},
    )
    superseding = fields.Integer(
        required=True,
        allow_none=True,
        metadata={"description": "Of those, how many replace an earlier memory."},
    )
    reused = fields.Boolean(
        required=True,
        allow_none=True,
        metadata={"description": "The result was reused from an identical earlier input."},
    )
    usage = fields.Nested(TurnUsageSchema, required=True, allow_none=True)


class TurnPageSchema(Schema):
    """One page of ``GET /v1/sessions/{id}/turns``, in turn order."""

    class Meta:
        unknown = RAISE

    items = fields.List(fields.Nested(RecordedTurnSchema), required=True)
    next_cursor = next_cursor_field()


class TurnListQuerySchema(Schema):
    """Query parameters of ``GET /v1/sessions/{id}/turns``."""

    class Meta:
        unknown = RAISE

    limit = page_limit_field()
    cursor = fields.String(
        validate=validate.Length(min=1, max=MAX_CURSOR_CHARS),
        metadata={
            "description": "Opaque; the `next_cursor` of the previous page, as it was given "
            "(anything else is 400 INVALID_CURSOR).",
            "format": TURN_CURSOR_FORMAT,
        },
    )


__all__ = [
    "MAX_TURNS_PER_REQUEST",
    "TURN_CURSOR_FORMAT",
    "TURN_STATES",
    "RecordedTurnSchema",
    "SessionCreateSchema",
    "SessionListQuerySchema",
    "SessionPageSchema",
    "SessionSchema",
    "TurnListQuerySchema",
    "TurnPageSchema",
    "TurnUsageSchema",
    "TurnsAppendSchema",
    "TurnsAppendedSchema",
]
