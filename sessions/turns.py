"""A session's turns: the append-only checkpoints (hashes) and their payload archive (content).

Every statement on ``ibex_core.checkpoints`` and ``ibex_core.checkpoint_payloads``. A turn is
stored once and never changed (the application role may only SELECT and INSERT these tables,
and a trigger rejects any UPDATE): :func:`check_stored` compares what is offered again with
what is stored, and :func:`insert_turns` appends the rest. The session row's counters are the
session store's to move, in the same transaction, under the session row's lock
(:meth:`sessions.store.SessionStore.sync_turns`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import peewee

from core.canonical import canonical_bytes
from core.errors import ImmutableTurnError, TurnIndexGapError
from models.sessions import Checkpoint, CheckpointPayload


def content_digest(value: Any) -> str:
    return hashlib.sha256(canonical_bytes(value)).hexdigest()


@dataclass(frozen=True)
class TurnInput:
    """One turn to append: what the harness recorded for one LLM call."""

    messages: list[dict[str, Any]]
    completion: dict[str, Any]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: int = 0
    is_streaming: bool = False
    is_complete: bool = True

    @classmethod
    def from_loaded(cls, turn: Mapping[str, Any]) -> TurnInput:
        """A turn as the import line and the sessions API load it (their schemas share these
        field names); a field a schema does not have keeps its default."""
        fields = {
            name: turn[name]
            for name in (
                "messages",
                "completion",
                "prompt_tokens",
                "completion_tokens",
                "latency_ms",
                "is_streaming",
                "is_complete",
            )
            if name in turn
        }
        return cls(**fields)

    @property
    def messages_hash(self) -> str:
        return content_digest(self.messages)

    @property
    def completion_hash(self) -> str:
        return content_digest(self.completion)


@dataclass(frozen=True)
class TurnRecord:
    """One stored turn with its content."""

    session_id: uuid.UUID
    turn_index: int
    messages: list[dict[str, Any]]
    completion: dict[str, Any]
    prompt_tokens: int
    completion_tokens: int
    latency_ms: int


def select_turns(session_id: uuid.UUID, first: int, last: int) -> list[TurnRecord]:
    """Turns ``first..last`` (inclusive) of a session with their content, in order, in the
    current transaction (the caller has set the tenant)."""
    rows: Any = (
        Checkpoint.select(
            Checkpoint.turn_index,
            Checkpoint.prompt_tokens,
            Checkpoint.completion_tokens,
            Checkpoint.latency_ms,
            CheckpointPayload.messages,
            CheckpointPayload.completion,
        )
        .join(CheckpointPayload, on=(CheckpointPayload.checkpoint_id == Checkpoint.id))
        .where(
            Checkpoint.session_id == session_id,
            Checkpoint.turn_index.between(max(first, 1), last),
        )
        .order_by(Checkpoint.turn_index)
        .tuples()
    )
    return [
        TurnRecord(session_id, ti, msgs, comp, pt, ct, lat) for ti, pt, ct, lat, msgs, comp in rows
    ]


def check_stored(
    db: peewee.Database,
    session_id: uuid.UUID,
    stored: int,
    turns: Sequence[TurnInput],
    first: int,
) -> None:
    """Refuse ``turns`` offered as turns ``first``, ``first`` + 1, ... of a session holding
    ``stored`` turns when they would skip one (:class:`TurnIndexGapError` names the next index)
    or differ from a stored one (checkpoints are immutable: :class:`ImmutableTurnError`); the
    same turns again pass (a replay)."""
    if first < 1:
        raise ValueError("turn indexes start at 1")
    if first > stored + 1:
        raise TurnIndexGapError(
            f"turn {first} would skip turns: the next turn of this session is {stored + 1}",
            expected_turn_index=stored + 1,
        )
    last = first + len(turns) - 1
    if first > stored or not turns:
        return
    rows: Any = (
        Checkpoint.select(
            Checkpoint.turn_index, Checkpoint.messages_hash, Checkpoint.completion_hash
        )
        .where(
            Checkpoint.session_id == session_id,
            Checkpoint.turn_index.between(first, min(stored, last)),
        )
        .order_by(Checkpoint.turn_index)
        .tuples()
        .bind(db)
    )
    for turn_index, messages_hash, completion_hash in rows:
        incoming = turns[turn_index - first]
        if (incoming.messages_hash, incoming.completion_hash) != (messages_hash, completion_hash):
            raise ImmutableTurnError(
                f"turn {turn_index} differs from the stored turn: checkpoints are immutable",
                turn_index=turn_index,
            )


def insert_turns(
    db: peewee.Database,
    org_id: uuid.UUID,
    session_id: uuid.UUID,
    turns: Sequence[TurnInput],
    first: int,
) -> None:
    """Append ``turns`` as turns ``first``, ``first`` + 1, ...: a checkpoint and its payload
    each, in the current transaction."""
    if not turns:
        return
    checkpoint_rows = []
    payload_rows = []
    for offset, turn in enumerate(turns):
        checkpoint_id = uuid.uuid4()
        turn_index = first + offset
        checkpoint_rows.append(
            {
                "id": checkpoint_id,
                "org_id": org_id,
                "session_id": session_id,
                "turn_index": turn_index,
                "messages_hash": turn.messages_hash,
                "completion_hash": turn.completion_hash,
                "prompt_tokens": turn.prompt_tokens,
                "completion_tokens": turn.completion_tokens,
                "latency_ms": turn.latency_ms,
                "is_streaming": turn.is_streaming,
                "is_complete": turn.is_complete,
            }
        )
        payload_rows.append(
            {
                "checkpoint_id": checkpoint_id,
                "org_id": org_id,
                "session_id": session_id,
                "turn_index": turn_index,
                "messages": turn.messages,
                "completion": turn.completion,
            }
        )
    Checkpoint.insert_many(checkpoint_rows).execute(db)
    CheckpointPayload.insert_many(payload_rows).execute(db)


# -- erasure (``ibex prune --deleted-older-than``): the owner role, across orgs ---------------


def erase_turns_of(db: peewee.Database, session_ids: Sequence[str]) -> tuple[int, int]:
    """Hard-delete the turns of these (erased) sessions: (checkpoints, payloads)."""
    payloads = db.execute_sql(
        "DELETE FROM ibex_core.checkpoint_payloads WHERE session_id = ANY(%s::uuid[])",
        (list(session_ids),),
    ).rowcount
    checkpoints = db.execute_sql(
        "DELETE FROM ibex_core.checkpoints WHERE session_id = ANY(%s::uuid[])",
        (list(session_ids),),
    ).rowcount
    return int(checkpoints), int(payloads)


def count_turns_of_deleted(db: peewee.Database, cutoff: dt.datetime) -> tuple[int, int]:
    """What :func:`erase_turns_of` would delete for the sessions deleted before ``cutoff``."""
    row = db.execute_sql(
        "WITH gone AS (SELECT s.id FROM ibex_core.sessions s WHERE s.deleted_at < %(cutoff)s)"
        " SELECT (SELECT count(*) FROM ibex_core.checkpoints c JOIN gone g ON g.id = c.session_id),"
        " (SELECT count(*) FROM ibex_core.checkpoint_payloads p"
        "   JOIN gone g ON g.id = p.session_id)",
        {"cutoff": cutoff},
    ).fetchone()
    return int(row[0]), int(row[1])
