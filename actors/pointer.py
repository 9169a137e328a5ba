"""``advance_pointer(org_id, session_id, turn_index)``: mark a turn done, move the pointer.

Running it twice is safe: marking done is conditional, and the pointer is computed under the
session row's lock as the highest turn with every turn up to it done, then written with
``GREATEST``, so a repeat, a late duplicate or a message for an incomplete turn changes nothing
and nothing ever moves the pointer backwards.
"""

from __future__ import annotations

import dramatiq

from actors.broker import broker
from actors.shell import run_route
from core.errors import PermanentError
from extraction.dispatch import ROUTES
from schema.messages import ActorName

ROUTE = ROUTES[ActorName.POINTER]


@dramatiq.actor(
    actor_name=ROUTE.actor.value,
    queue_name=ROUTE.queue.value,
    throws=(PermanentError,),
    broker=broker,
)
def advance_pointer(org_id: str, session_id: str, turn_index: int) -> None:
    run_route(ROUTE, {"org_id": org_id, "session_id": session_id, "turn_index": turn_index})
