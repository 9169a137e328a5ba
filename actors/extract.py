"""``extract_turn(org_id, session_id, turn_index)``: extract one turn's memories.

Running it twice is safe: a stored result is reused without calling the LLM; only a delivery
that takes the turn's claim in Postgres calls the LLM (a concurrent one waits with
``dramatiq.Retry``); the result is persisted first-wins before any side effect; and the
``write_memory`` messages it sends name slots, so sending them again writes nothing new. An
answer the database could not take is kept for this message's retry, which takes over the
claim it left (see :mod:`actors.stage`).
"""

from __future__ import annotations

from actors.stage import stage_actor
from extraction.dispatch import ROUTES
from schema.messages import ActorName

#: A worker process runs the messages it has fetched lowest priority first: its writes and
#: pointer moves (priority 0) before its extractions, so turns whose LLM call is done are
#: finished before new ones start, instead of their writes queueing behind LLM calls.
#: Extractions cannot starve: every write and pointer move comes from an extraction.
EXTRACT_PRIORITY = 10


@stage_actor(ROUTES[ActorName.EXTRACT], priority=EXTRACT_PRIORITY)
def extract_turn(org_id: str, session_id: str, turn_index: int) -> None:
    """Extract one turn: :func:`extraction.stages.extract_turn`."""
