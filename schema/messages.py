"""The pipeline's actor messages (the four stages: docs/architecture.md).

Every message carries the slot identity it works on, nothing else: ``scan_sessions`` (optional
filters), ``extract_turn`` and ``advance_pointer`` (org_id, session_id, turn_index),
``write_memory`` (the same plus ordinal). A payload that fails these schemas is an
:class:`~core.errors.InvalidMessageError` (through :func:`schema.load`): retrying cannot fix it,
so it goes to the dead-letter queue at once. The persisted extraction result has its own schema in
:mod:`schema.extraction`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from marshmallow import RAISE, Schema, fields, validate

from schema.common import StrictInteger


class Queue(StrEnum):
    """The pipeline's queues: one per stage, so a backlog of writes never delays the pointer.
    The one list of queue names (the broker's, ``ibex status``'s, the dead letters')."""

    SCAN = "scan"
    EXTRACT = "extract"
    WRITE = "write"
    POINTER = "pointer"


#: The chat path's spool (turns the proxy recorded, for a worker to store): not a pipeline
#: stage, but a queue of the same workers that ``ibex status`` and the backlog gauges show.
CHAT_TURNS_QUEUE = "chat_turns"

#: Every queue the workers consume, as ``ibex status`` lists them.
WORKER_QUEUES = (*(queue.value for queue in Queue), CHAT_TURNS_QUEUE)


class ActorName(StrEnum):
    """The pipeline's actors, by the name their messages carry."""

    SCAN = "scan_sessions"
    EXTRACT = "extract_turn"
    WRITE = "write_memory"
    POINTER = "advance_pointer"


class _Strict(Schema):
    class Meta:
        unknown = RAISE


class ScanMessageSchema(_Strict):
    """``scan_sessions``: optional filters; an empty message scans everything."""

    session_id = fields.UUID(load_default=None, allow_none=True)


class TurnMessageSchema(_Strict):
    """``extract_turn`` and ``advance_pointer``: one turn of one session."""

    org_id = fields.UUID(required=True)
    session_id = fields.UUID(required=True)
    turn_index = StrictInteger(required=True, validate=validate.Range(min=1))


class SlotMessageSchema(TurnMessageSchema):
    """``write_memory``: one memory slot (0-based ordinal in the turn's persisted result)."""

    ordinal = StrictInteger(required=True, validate=validate.Range(min=0))


#: actor name -> schema of its message
MESSAGE_SCHEMAS: dict[str, type[Schema]] = {
    ActorName.SCAN: ScanMessageSchema,
    ActorName.EXTRACT: TurnMessageSchema,
    ActorName.WRITE: SlotMessageSchema,
    ActorName.POINTER: TurnMessageSchema,
}


def _quick_shape(
    schema: type[Schema],
) -> tuple[tuple[str, ...], tuple[tuple[str, int], ...]] | None:
    """A message schema's (required UUID fields, required integer fields with their least
    value), read from its fields; None when it has any other kind of field (then
    :func:`quick_load` leaves its messages to it)."""
    ids: list[str] = []
    integers: list[tuple[str, int]] = []
    for name, field in schema().fields.items():
        checks = list(field.validators)
        if type(field) is fields.UUID and field.required and not checks:
            ids.append(name)
            continue
        if type(field) is StrictInteger and field.required and len(checks) == 1:
            (check,) = checks
            if (
                type(check) is validate.Range
                and isinstance(check.min, int)
                and check.min_inclusive
                and check.max is None
            ):
                integers.append((name, check.min))
                continue
        return None
    return tuple(ids), tuple(integers)


#: actor name -> the shape :func:`quick_load` reads, derived from the schemas above.
_QUICK_FIELDS = {
    name: shape
    for name, schema in MESSAGE_SCHEMAS.items()
    if (shape := _quick_shape(schema)) is not None
}


def quick_load(actor_name: str, data: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the actor's schema loads from ``data`` when it is a usual message of a turn or a
    slot (exactly its fields, each id a string ``uuid.UUID`` reads, each integer an ``int``
    in range), without marshmallow's machinery (a tenth of its cost); None for anything else
    (a scan's message included), which the schema then loads or refuses, naming each bad
    field as it always did."""
    shape = _QUICK_FIELDS.get(actor_name)
    if shape is None:
        return None
    ids, integers = shape
    if len(data) != len(ids) + len(integers):
        return None
    loaded: dict[str, Any] = {}
    try:
        for name in ids:
            value = data[name]
            if type(value) is not str:
                return None
            loaded[name] = uuid.UUID(value)
        for name, least in integers:
            value = data[name]
            if type(value) is not int or value < least:
                return None
            loaded[name] = value
    except (KeyError, ValueError):
        return None
    return loaded


__all__ = [
    "MESSAGE_SCHEMAS",
    "ActorName",
    "Queue",
    "ScanMessageSchema",
    "SlotMessageSchema",
    "TurnMessageSchema",
    "quick_load",
]
