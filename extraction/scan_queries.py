"""The scan's statements: which sessions have unextracted turns, and the one call per batch
that records their turns and leases the ones to send.

Candidates are read across orgs as the scan role, which sees identities only; every candidate
query shares :data:`CANDIDATE_WHERE`, the predicate of the partial index
``idx_sessions_agent_extraction``. Recording and leasing run per org under row-level security,
in the server function ``ibex_core.scan_record_and_lease``: one round trip for the batch.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import peewee

from core.db import scan_scope, transaction, uuid_column
from extraction.values import Candidate, TurnRef, UUIDLike, uuid_text

#: A session with unextracted turns: the predicate of ``idx_sessions_agent_extraction``.
CANDIDATE_WHERE = "status = 'completed' AND deleted_at IS NULL AND last_extracted_turn < turn_count"

_CANDIDATE_COLUMNS = "org_id, agent_id, id, last_extracted_turn, turn_count"

#: One page of candidates, keyset-paginated by (agent_id, id).
CANDIDATES_SQL = f"""
SELECT {_CANDIDATE_COLUMNS}
  FROM ibex_core.sessions
 WHERE {CANDIDATE_WHERE}
   AND (agent_id, id) > (%s::uuid, %s::uuid)
 ORDER BY agent_id, id
 LIMIT %s
"""

#: One session, if it is a candidate.
CANDIDATE_SQL = f"""
SELECT {_CANDIDATE_COLUMNS}
  FROM ibex_core.sessions
 WHERE id = %s AND {CANDIDATE_WHERE}
"""

_ZERO = "00000000-0000-0000-0000-000000000000"


# The batch's record-and-lease: one call of ``ibex_core.scan_record_and_lease`` (migration
# 000011) by the login role, which the function switches from: it runs one statement per org
# inside the server, each as the tenant role under that org's ``ibex.org_id``. The turns come
# back in the order they are sent in: by the agent's first appearance in the batch
# (``order``), then by turn and session.
_RECORD_AND_LEASE = """
SELECT l.session_id::text, l.turn_index
  FROM ibex_core.scan_record_and_lease(
           %(orgs)s::uuid[], %(session_ends)s::int[], %(sessions)s::uuid[],
           %(agent_ends)s::int[], %(agents)s::uuid[], %(budgets)s::int[], %(lease)s) l
  JOIN unnest(%(order)s::uuid[]) WITH ORDINALITY AS o(agent_id, rank)
    ON o.agent_id = l.agent_id
 ORDER BY o.rank, l.turn_index, l.session_id
"""


def _candidate(row: Sequence[Any]) -> Candidate:
    org, agent, sid, pointer, count = row
    return Candidate(
        uuid_column(org), uuid_column(agent), uuid_column(sid), int(pointer), int(count)
    )


class ScanQueries:
    """The scan's reads and its record-and-lease statement, on the given database."""

    def __init__(self, db: peewee.Database) -> None:
        self.db = db

    def _sql(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        return self.db.execute_sql(sql, params)

    def candidates(
        self, limit: int, after: tuple[uuid.UUID, uuid.UUID] | None = None
    ) -> list[Candidate]:
        """Completed, undeleted sessions with unextracted turns, keyset-paginated by
        (agent_id, session_id): the cross-org read, identities only."""
        agent_after, session_after = (str(after[0]), str(after[1])) if after else (_ZERO, _ZERO)
        with scan_scope(self.db):
            rows = self._sql(CANDIDATES_SQL, (agent_after, session_after, limit)).fetchall()
        return [_candidate(row) for row in rows]

    def find_candidate(self, session_id: UUIDLike) -> Candidate | None:
        """One session's identities, across orgs (scan role), if it has unextracted turns."""
        with scan_scope(self.db):
            row = self._sql(CANDIDATE_SQL, (uuid_text(session_id),)).fetchone()
        return None if row is None else _candidate(row)

    def lease_turns(
        self,
        candidates: Sequence[Candidate],
        budgets: Mapping[uuid.UUID, int],
        lease_seconds: int,
    ) -> list[TurnRef]:
        """Record every unextracted turn of ``candidates`` (one scan batch, any orgs) and lease,
        per agent, up to ``budgets[agent]`` of those that are not done, not failed and not
        leased: the turns to send. Agents without a positive budget are left out altogether.

        One transaction and one round trip for the batch: the server runs one statement per
        org in it (row-level security applies per statement, as the tenant role under that
        org's ``ibex.org_id``). The turns come back ordered by the agent's first appearance in
        ``candidates``, then by turn and session."""
        by_org: dict[uuid.UUID, list[Candidate]] = {}
        agent_order: dict[uuid.UUID, None] = {}
        for c in candidates:
            if budgets.get(c.agent_id, 0) <= 0:
                continue
            by_org.setdefault(c.org_id, []).append(c)
            agent_order.setdefault(c.agent_id)
        if not by_org:
            return []
        # The leased turns name their session as text, mapped back to the candidate: no UUID
        # is parsed per turn.
        by_text: dict[str, Candidate] = {}
        session_ends: list[int] = []
        agents: list[str] = []
        agent_budgets: list[int] = []
        agent_ends: list[int] = []
        for group in by_org.values():
            by_text.update((str(c.session_id), c) for c in group)
            session_ends.append(len(by_text))
            for agent in dict.fromkeys(c.agent_id for c in group):
                agents.append(str(agent))
                agent_budgets.append(int(budgets[agent]))
            agent_ends.append(len(agents))
        with transaction(self.db):
            rows = self._sql(
                _RECORD_AND_LEASE,
                {
                    "orgs": [str(org) for org in by_org],
                    "session_ends": session_ends,
                    "sessions": list(by_text),
                    "agent_ends": agent_ends,
                    "agents": agents,
                    "budgets": agent_budgets,
                    "lease": lease_seconds,
                    "order": [str(a) for a in agent_order],
                },
            ).fetchall()
        refs = []
        for sid, ti in rows:
            c = by_text[sid]
            refs.append(TurnRef(c.org_id, c.session_id, ti))
        return refs


__all__ = ["CANDIDATES_SQL", "CANDIDATE_SQL", "CANDIDATE_WHERE", "ScanQueries"]
