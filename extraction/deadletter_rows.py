"""The dead-letter mirror in Postgres (``ibex_core.dead_letters``): every statement on it. The
worker writes a row per failed message (:func:`mirror`); ``ibex dlq`` reads the open rows,
claims one for a replay (which returns its failed turn to the pipeline) or purges it.

What a dead message looks like in Redis, and how it is enqueued again, is the broker's side
(``extraction.deadletters``).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import peewee

from core.db import operator_scope, transaction
from extraction.turns import TurnStore
from extraction.values import TurnRef


@dataclass(frozen=True)
class DeadLetterRecord:
    """One failed message as the dead-letter mirror stores it."""

    redis_message_id: str
    message_id: str
    queue_name: str
    actor_name: str
    payload: dict[str, Any]
    exception_type: str | None
    exception_message: str | None
    traceback: str | None
    attempts: int
    org_id: uuid.UUID | None = None
    session_id: uuid.UUID | None = None
    turn_index: int | None = None
    ordinal: int | None = None


def mirror(db: peewee.Database, record: DeadLetterRecord) -> None:
    """Insert one dead letter (owner role: operator data); a second copy of it is ignored."""
    with transaction(db):
        db.execute_sql(
            "INSERT INTO ibex_core.dead_letters"
            " (redis_message_id, message_id, queue_name, actor_name, org_id, session_id,"
            "  turn_index, ordinal, payload, exception_type, exception_message, traceback,"
            "  attempts)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s)"
            " ON CONFLICT (redis_message_id) DO NOTHING",
            (
                record.redis_message_id,
                record.message_id,
                record.queue_name,
                record.actor_name,
                str(record.org_id) if record.org_id else None,
                str(record.session_id) if record.session_id else None,
                record.turn_index,
                record.ordinal,
                json.dumps(record.payload, default=str),
                record.exception_type,
                record.exception_message,
                record.traceback,
                record.attempts,
            ),
        )


#: The columns :func:`open_rows` returns, in order.
COLUMNS = (
    "id",
    "redis_message_id",
    "message_id",
    "queue_name",
    "actor_name",
    "payload",
    "failed_at",
    "attempts",
    "exception_type",
    "exception_message",
    "traceback",
    "org_id",
    "session_id",
    "turn_index",
    "ordinal",
)


def open_rows(db: peewee.Database) -> list[tuple[Any, ...]]:
    """Every open row (not replayed, not purged), in :data:`COLUMNS` order, oldest first."""
    with operator_scope(db):
        return list(
            db.execute_sql(
                f"SELECT {', '.join(COLUMNS)} FROM ibex_core.dead_letters"
                " WHERE replayed_at IS NULL AND purged_at IS NULL ORDER BY id"
            ).fetchall()
        )


def open_by_queue(db: peewee.Database) -> dict[str, int]:
    """How many rows are open (not replayed, not purged) per queue."""
    with operator_scope(db):
        rows = db.execute_sql(
            "SELECT queue_name, count(*) FROM ibex_core.dead_letters"
            " WHERE replayed_at IS NULL AND purged_at IS NULL GROUP BY queue_name"
        ).fetchall()
    return {str(queue): int(count) for queue, count in rows}


def was_replayed(db: peewee.Database, ref: str) -> bool:
    """Whether a row named by mirror id, Redis message id or message id was replayed."""
    with operator_scope(db):
        row = db.execute_sql(
            "SELECT 1 FROM ibex_core.dead_letters WHERE replayed_at IS NOT NULL AND"
            " (id::text = %s OR redis_message_id = %s OR message_id = %s)",
            (ref, ref, ref),
        ).fetchone()
    return row is not None


def claim_replay(
    db: peewee.Database,
    mirror_id: int,
    new_redis_id: str,
    *,
    org_id: str | None,
    session_id: str | None,
    turn_index: int | None,
    lease_seconds: int,
) -> bool:
    """Mark the row replayed (as ``new_redis_id``) and return its turn from ``failed`` to where
    its persisted state says, with a fresh lease, in one transaction. False when another
    replay or a purge took the row first."""
    with transaction(db):
        row = db.execute_sql(
            "UPDATE ibex_core.dead_letters SET replayed_at = now(), replayed_as = %s"
            " WHERE id = %s AND replayed_at IS NULL AND purged_at IS NULL RETURNING id",
            (new_redis_id, mirror_id),
        ).fetchone()
        if row is None:
            return False
        if org_id and session_id and turn_index is not None:
            TurnStore(db).reopen_for_replay(
                TurnRef.of(org_id, session_id, turn_index), lease_seconds
            )
        return True


def mark_purged(db: peewee.Database, mirror_id: int) -> None:
    with transaction(db):
        db.execute_sql(
            "UPDATE ibex_core.dead_letters SET purged_at = now()"
            " WHERE id = %s AND purged_at IS NULL",
            (mirror_id,),
        )


__all__ = [
    "COLUMNS",
    "DeadLetterRecord",
    "claim_replay",
    "mark_purged",
    "mirror",
    "open_by_queue",
    "open_rows",
    "was_replayed",
]


def erase_of_sessions(db: peewee.Database, session_ids: Sequence[str]) -> int:
    """Hard-delete the mirrored dead letters of these (erased) sessions."""
    return int(
        db.execute_sql(
            "DELETE FROM ibex_core.dead_letters WHERE session_id = ANY(%s::uuid[])",
            (list(session_ids),),
        ).rowcount
    )


def count_of_deleted_sessions(db: peewee.Database, cutoff: dt.datetime) -> int:
    """What :func:`erase_of_sessions` would delete for the sessions deleted before ``cutoff``."""
    row = db.execute_sql(
        "SELECT count(*) FROM ibex_core.dead_letters d JOIN ibex_core.sessions s"
        " ON s.id = d.session_id WHERE s.deleted_at < %s",
        (cutoff,),
    ).fetchone()
    return int(row[0])
