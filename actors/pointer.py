"""``advance_pointer(org_id, session_id, turn_index)``: mark a turn done, move the pointer.

Running it twice is safe: marking done is conditional, and the pointer is computed under the
session row's lock as the highest turn with every turn up to it done, then written with
``GREATEST``, so a repeat, a late duplicate or a message for an incomplete turn changes nothing
and nothing ever moves the pointer backwards.
"""

from __future__ import annotations

import dramatiq

from actors.broker import Queue, broker
from actors.shell import run_stage
from core.errors import PermanentError
from extraction import stages
from schema import load
from schema.messages import TurnMessageSchema

_SCHEMA = TurnMessageSchema()


@dramatiq.actor(
    actor_name="advance_pointer", queue_name=Queue.POINTER, throws=(PermanentError,), broker=broker
)
def advance_pointer(org_id: str, session_id: str, turn_index: int) -> None:
    msg = load(
        _SCHEMA,
        {"org_id": org_id, "session_id": session_id, "turn_index": turn_index},
        what="advance_pointer message",
    )
    run_stage(
        lambda deps: stages.advance_pointer(
            deps, msg["org_id"], msg["session_id"], msg["turn_index"]
        )
    )
