"""``advance_pointer(org_id, session_id, turn_index)``: mark a turn done, move the pointer.

Running it twice is safe: marking done is conditional, and the pointer is computed under the
session row's lock as the highest turn with every turn up to it done, then written with
``GREATEST``, so a repeat, a late duplicate or a message for an incomplete turn changes nothing
and nothing ever moves the pointer backwards.
"""

from __future__ import annotations

from actors.stage import stage_actor
from extraction.dispatch import ROUTES
from schema.messages import ActorName


@stage_actor(ROUTES[ActorName.POINTER])
def advance_pointer(org_id: str, session_id: str, turn_index: int) -> None:
    """Mark a turn done and move the pointer: :func:`extraction.stages.complete_turn`."""
