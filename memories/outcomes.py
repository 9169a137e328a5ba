"""What a create decided, and the answer each outcome gives.

A replay must give the response first given byte for byte, so an outcome carries its answer
(status, body, headers) as bytes, built from the row or the memory id that determines it; the
web door sends it as it is. :func:`stored_answer` says what the idempotency key keeps of an
outcome.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from memories.idempotency import KeyAnswer, StoredAnswer
from memories.store import MemoryRow
from schema import describe_errors
from schema.bodies import dumps, error_body

REPLAYED_HEADER = "Idempotent-Replayed"


@dataclass(frozen=True)
class Response:
    """What an outcome answers over HTTP; always a JSON body."""

    status: int
    body: bytes
    location: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Created:
    row: MemoryRow

    def response(self) -> Response:
        # As created: a replay answers the same bytes even after a later supersession.
        return Response(201, dumps(self.row.as_json(as_created=True)), location_of(self.row))


@dataclass(frozen=True)
class KeyConflict:
    """The key was used with another body; ``existing_id`` when a row holds it."""

    existing_id: uuid.UUID | None = None

    def response(self) -> Response:
        message = "this idempotency key was used with a different body"
        if self.existing_id is None:
            return Response(409, error_body("IDEMPOTENCY_CONFLICT", message))
        return Response(
            409, error_body("IDEMPOTENCY_CONFLICT", message, existing_id=str(self.existing_id))
        )


@dataclass(frozen=True)
class DuplicateContent:
    """A live memory of this org and agent holds the same normalised content."""

    existing_id: uuid.UUID
    #: True when the existing memory is near-identical rather than the same normalised text
    #: (the answer is the same; only the metrics tell them apart).
    near: bool = False

    def response(self) -> Response:
        return Response(
            409,
            error_body(
                "DUPLICATE_CONTENT",
                "a memory with the same content exists for this agent",
                existing_id=str(self.existing_id),
            ),
        )


@dataclass(frozen=True)
class Replayed:
    """The response first given for this key, rebuilt byte for byte: a created memory from
    the row that holds the key, a 409 from the memory id the key's record names."""

    first: Created | DuplicateContent | KeyConflict
    source: str  # "redis" (a finished record) or "postgres" (the row alone), the metric's label

    def response(self) -> Response:
        first = self.first.response()
        return Response(first.status, first.body, first.location, headers={REPLAYED_HEADER: "true"})


@dataclass(frozen=True)
class InProgress:
    """Another request holds a live lease on the key; retry after ``retry_after`` seconds."""

    retry_after: int

    def response(self) -> Response:
        body = error_body(
            "IDEMPOTENCY_IN_PROGRESS",
            "a request with this idempotency key is still running",
            retry_after=self.retry_after,
        )
        return Response(409, body, headers={"Retry-After": str(self.retry_after)})


@dataclass(frozen=True)
class Invalid:
    """The document is not a valid memory, or names an agent or session the org lacks."""

    fields: Any

    def response(self) -> Response:
        message = f"invalid request: {describe_errors(self.fields)}"
        return Response(422, error_body("VALIDATION_FAILED", message, fields=self.fields))


@dataclass(frozen=True)
class UnknownOrg:
    def response(self) -> Response:
        return Response(403, error_body("FORBIDDEN_ORG", "no such org"))


#: What ``create`` decided. Each says what it answers (``response``); :func:`stored_answer`
#: says what the idempotency key keeps of it.
Outcome: TypeAlias = (
    Created | Replayed | KeyConflict | DuplicateContent | InProgress | Invalid | UnknownOrg
)


def location_of(row: MemoryRow) -> str:
    return f"/v1/memories/{row.id}"


def for_key_row(row: MemoryRow, fingerprint: str, source: str = "postgres") -> Outcome:
    """A committed row already holds this key: the same request replays, another conflicts."""
    if row.request_fingerprint == fingerprint:
        return Replayed(Created(row), source)
    return KeyConflict(row.id)


def stored_answer(outcome: Outcome) -> StoredAnswer | None:
    """What the key's record keeps of an outcome; None when the key keeps nothing."""
    if isinstance(outcome, Replayed):
        return stored_answer(outcome.first)
    if isinstance(outcome, Created):
        return StoredAnswer(KeyAnswer.CREATED, outcome.row.id)
    if isinstance(outcome, DuplicateContent):
        return StoredAnswer(KeyAnswer.DUPLICATE, outcome.existing_id)
    if isinstance(outcome, KeyConflict) and outcome.existing_id is not None:
        return StoredAnswer(KeyAnswer.CONFLICT, outcome.existing_id)
    return None
