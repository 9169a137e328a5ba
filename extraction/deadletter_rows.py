"""The dead-letter mirror in Postgres (``ibex_core.dead_letters``), as ``ibex dlq`` reads and
changes it: open rows, the replay claim that returns a failed turn to the pipeline, purging.

The rows are written by the worker (``ExtractionState.mirror_dead_letter``); what a dead
message looks like in Redis, and how it is enqueued again, is the broker's side
(``actors.deadletters``).
"""

from __future__ import annotations

from typing import Any

import peewee

from core.db import enter_tenant, operator_scope, transaction

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
            enter_tenant(db, org_id)
            db.execute_sql(
                "UPDATE ibex_core.extraction_turns"
                " SET state = CASE WHEN result IS NULL THEN 'pending'::ibex_core.turn_state"
                "                  ELSE 'extracted'::ibex_core.turn_state END,"
                "     last_error = NULL, attempts = 0,"
                "     lease_expires_at = now() + make_interval(secs => %s)"
                " WHERE session_id = %s AND turn_index = %s AND state = 'failed'",
                (lease_seconds, session_id, turn_index),
            )
        return True


def mark_purged(db: peewee.Database, mirror_id: int) -> None:
    with transaction(db):
        db.execute_sql(
            "UPDATE ibex_core.dead_letters SET purged_at = now()"
            " WHERE id = %s AND purged_at IS NULL",
            (mirror_id,),
        )


__all__ = ["COLUMNS", "claim_replay", "mark_purged", "open_rows", "was_replayed"]
