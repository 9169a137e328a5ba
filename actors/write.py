"""``write_memory(org_id, session_id, turn_index, ordinal)``: write one memory slot.

Running it twice is safe: the body comes only from the persisted result (byte-for-byte the same
on every attempt) and is sent under the slot's idempotency key, so the memory service replays
or answers 409 (both success) instead of storing a second row; a slot already recorded is not
POSTed again; and recording the slot is ``ON CONFLICT DO NOTHING`` under the turn row's lock.
"""

from __future__ import annotations

from actors.stage import stage_actor
from extraction.dispatch import ROUTES
from schema.messages import ActorName


@stage_actor(ROUTES[ActorName.WRITE])
def write_memory(org_id: str, session_id: str, turn_index: int, ordinal: int) -> None:
    """Write one memory slot: :func:`extraction.stages.write_memory`."""
