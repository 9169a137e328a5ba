"""``write_memory(org_id, session_id, turn_index, ordinal)``: write one memory slot.

Running it twice is safe: the body comes only from the persisted result (byte-for-byte the same
on every attempt) and is sent under the slot's idempotency key, so the memory service replays
or answers 409 (both success) instead of storing a second row; a slot already recorded is not
POSTed again; and recording the slot is ``ON CONFLICT DO NOTHING`` under the turn row's lock.
"""

from __future__ import annotations

import dramatiq

from actors.broker import broker
from actors.shell import run_route
from core.errors import PermanentError
from extraction.dispatch import ROUTES
from schema.messages import ActorName

ROUTE = ROUTES[ActorName.WRITE]


@dramatiq.actor(
    actor_name=ROUTE.actor.value,
    queue_name=ROUTE.queue.value,
    throws=(PermanentError,),
    broker=broker,
)
def write_memory(org_id: str, session_id: str, turn_index: int, ordinal: int) -> None:
    run_route(
        ROUTE,
        {"org_id": org_id, "session_id": session_id, "turn_index": turn_index, "ordinal": ordinal},
    )
