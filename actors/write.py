"""``write_memory(org_id, session_id, turn_index, ordinal)``: write one memory slot.

Running it twice is safe: the body comes only from the persisted result (byte-for-byte the same
on every attempt) and is sent under the slot's idempotency key, so the memory service replays
or answers 409 (both success) instead of storing a second row; a slot already recorded is not
POSTed again; and recording the slot is ``ON CONFLICT DO NOTHING`` under the turn row's lock.
"""

from __future__ import annotations

import dramatiq

from actors.broker import Queue, broker
from actors.shell import run_stage
from core.errors import PermanentError
from extraction import stages
from schema import load
from schema.messages import SlotMessageSchema

_SCHEMA = SlotMessageSchema()


@dramatiq.actor(
    actor_name="write_memory", queue_name=Queue.WRITE, throws=(PermanentError,), broker=broker
)
def write_memory(org_id: str, session_id: str, turn_index: int, ordinal: int) -> None:
    msg = load(
        _SCHEMA,
        {"org_id": org_id, "session_id": session_id, "turn_index": turn_index, "ordinal": ordinal},
        what="write_memory message",
    )
    run_stage(
        lambda deps: stages.write_memory(
            deps, msg["org_id"], msg["session_id"], msg["turn_index"], msg["ordinal"]
        )
    )
