"""Each turn's extraction state, as the console shows it, from the pipeline's own tables.

One function, :func:`turn_states`, so that the turn states of the sessions API (when they land)
can replace it with one import. The states are the contract's names:

- ``extracted``: at or below the session's pointer, or its row is ``done``; ``empty`` when the
  persisted result held no memory;
- ``extracting``: its LLM result is persisted and its memories are being written;
- ``dead_lettered``: its message went to the dead letters (the mirror marks the row ``failed``
  and ``ibex dlq replay`` reopens it);
- ``pending``: anything else (not scanned yet, queued, or waiting for its LLM call).
"""

from __future__ import annotations

import uuid

import peewee

from core.db import tenant

TURN_ROWS_SQL = (
    "SELECT turn_index, state::text,"
    " coalesce(memory_count, 0) AS produced"
    " FROM ibex_core.extraction_turns WHERE org_id = %s AND session_id = %s"
    " AND turn_index BETWEEN %s AND %s"
)


def turn_states(
    db: peewee.Database,
    org_id: uuid.UUID,
    session_id: uuid.UUID,
    pointer: int,
    first: int,
    last: int,
) -> dict[int, str]:
    """The state of each turn ``first..last`` of the session whose pointer is ``pointer``."""
    with tenant(db, org_id):
        rows = db.execute_sql(TURN_ROWS_SQL, (str(org_id), str(session_id), first, last)).fetchall()
    found = {int(index): (str(state), int(produced)) for index, state, produced in rows}
    states: dict[int, str] = {}
    for index in range(first, last + 1):
        state, produced = found.get(index, ("pending", 0))
        if state == "failed":
            states[index] = "dead_lettered"
        elif state == "done" or index <= pointer:
            states[index] = "extracted" if produced or index not in found else "empty"
        elif state == "extracted":
            states[index] = "extracting"
        else:
            states[index] = "pending"
    return states
