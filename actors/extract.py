"""``extract_turn(org_id, session_id, turn_index)``: extract one turn's memories.

Running it twice is safe: a stored result is reused without calling the LLM; only a delivery
that takes the turn's claim in Postgres calls the LLM (a concurrent one waits with
``dramatiq.Retry``); the result is persisted first-wins before any side effect; and the
``write_memory`` messages it sends name slots, so sending them again writes nothing new. An
answer the database could not take is kept for this message's retry, which takes over the
claim it left (see :mod:`actors.shell`).
"""

from __future__ import annotations

import dramatiq

from actors.broker import broker
from actors.shell import run_route
from core.errors import PermanentError
from extraction.dispatch import ROUTES
from schema.messages import ActorName

ROUTE = ROUTES[ActorName.EXTRACT]

#: A worker process runs the messages it has fetched lowest priority first: its writes and
#: pointer moves (priority 0) before its extractions, so turns whose LLM call is done are
#: finished before new ones start, instead of their writes queueing behind LLM calls.
#: Extractions cannot starve: every write and pointer move comes from an extraction.
EXTRACT_PRIORITY = 10


@dramatiq.actor(
    actor_name=ROUTE.actor.value,
    queue_name=ROUTE.queue.value,
    priority=EXTRACT_PRIORITY,
    throws=(PermanentError,),
    broker=broker,
)
def extract_turn(org_id: str, session_id: str, turn_index: int) -> None:
    run_route(ROUTE, {"org_id": org_id, "session_id": session_id, "turn_index": turn_index})
