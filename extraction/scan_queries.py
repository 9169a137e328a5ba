"""The scan's statements: which sessions have unextracted turns, and the one statement per
org that records their turns and leases the ones to send.

Candidates are read across orgs as the scan role, which sees identities only; every candidate
query shares :data:`CANDIDATE_WHERE`, the predicate of the partial index
``idx_sessions_agent_extraction``. Recording and leasing run per org under row-level security.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import peewee

from core.db import APP_ROLE, scan_scope, transaction
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


# One statement per org and batch: record every unextracted turn of the org's candidate
# sessions and lease, per agent, up to that agent's budget of the turns that are not done, not
# failed and not leased, lowest turn first across the agent's sessions. New rows are inserted
# carrying their lease (no UPDATE, no row triggers); rows recorded earlier whose lease is free
# or expired are taken with SKIP LOCKED, so two scans never lease the same turn.
_RECORD_AND_LEASE = """
WITH budget AS (
    SELECT b.agent_id, b.budget
      FROM unnest(%(agents)s::uuid[], %(budgets)s::int[]) AS b(agent_id, budget)
),
sess AS (
    SELECT s.id, s.org_id, s.agent_id, s.last_extracted_turn, s.turn_count,
           (s.status = 'completed' AND s.deleted_at IS NULL) AS recordable
      FROM ibex_core.sessions s
     WHERE s.id = ANY(%(ids)s::uuid[])
),
free AS (
    SELECT e.org_id, e.session_id, e.turn_index, s.agent_id
      FROM ibex_core.extraction_turns e
      JOIN sess s ON s.id = e.session_id
     WHERE e.session_id = ANY(%(ids)s::uuid[])
       AND e.state IN ('pending', 'extracted')
       AND e.turn_index > s.last_extracted_turn
       AND e.turn_index <= s.turn_count
       -- A lease runs at most EXTRACTION_LEASE_SECONDS from now as currently set: lowering
       -- the setting shortens the leases granted under the old one.
       AND (e.lease_expires_at IS NULL OR e.lease_expires_at <= now()
            OR e.lease_expires_at > now() + make_interval(secs => %(lease)s))
       FOR UPDATE OF e SKIP LOCKED
),
missing AS (
    SELECT s.org_id, s.id AS session_id, g AS turn_index, s.agent_id
      FROM sess s
     CROSS JOIN LATERAL generate_series(s.last_extracted_turn + 1, s.turn_count) AS g
     WHERE s.recordable
       AND NOT EXISTS (SELECT 1 FROM ibex_core.extraction_turns x
                        WHERE x.session_id = s.id AND x.turn_index = g)
),
ranked AS (
    SELECT c.org_id, c.session_id, c.turn_index, c.is_new,
           row_number() OVER (PARTITION BY c.agent_id ORDER BY c.turn_index, c.session_id)
               <= b.budget AS lease
      FROM (SELECT org_id, session_id, turn_index, agent_id, false AS is_new FROM free
            UNION ALL
            SELECT org_id, session_id, turn_index, agent_id, true FROM missing) c
      JOIN budget b ON b.agent_id = c.agent_id
),
inserted AS (
    INSERT INTO ibex_core.extraction_turns (org_id, session_id, turn_index, lease_expires_at)
    SELECT org_id, session_id, turn_index,
           CASE WHEN lease THEN now() + make_interval(secs => %(lease)s) END
      FROM ranked
     WHERE is_new
    ON CONFLICT DO NOTHING
    RETURNING session_id, turn_index, lease_expires_at IS NOT NULL AS leased
),
updated AS (
    UPDATE ibex_core.extraction_turns t
       SET lease_expires_at = now() + make_interval(secs => %(lease)s)
      FROM ranked r
     WHERE NOT r.is_new AND r.lease
       AND t.session_id = r.session_id AND t.turn_index = r.turn_index
    RETURNING t.session_id, t.turn_index
)
SELECT session_id, turn_index FROM inserted WHERE leased
UNION ALL
SELECT session_id, turn_index FROM updated
"""


def _candidate(row: Sequence[Any]) -> Candidate:
    org, agent, sid, pointer, count = row
    return Candidate(
        uuid.UUID(str(org)), uuid.UUID(str(agent)), uuid.UUID(str(sid)), int(pointer), int(count)
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

        One transaction for the batch and one statement per org in it (row-level security
        applies per statement, under that org's ``ibex.org_id``). The turns come back ordered
        by the agent's first appearance in ``candidates``, then by turn and session."""
        by_org: dict[uuid.UUID, list[Candidate]] = {}
        agent_order: dict[uuid.UUID, int] = {}
        for c in candidates:
            if budgets.get(c.agent_id, 0) <= 0:
                continue
            by_org.setdefault(c.org_id, []).append(c)
            agent_order.setdefault(c.agent_id, len(agent_order))
        if not by_org:
            return []
        agent_of: dict[uuid.UUID, uuid.UUID] = {}
        refs: list[TurnRef] = []
        with transaction(self.db):
            switch_role = f"SET LOCAL ROLE {APP_ROLE}; "
            for org, group in by_org.items():
                agents = sorted({c.agent_id for c in group}, key=agent_order.__getitem__)
                for c in group:
                    agent_of[c.session_id] = c.agent_id
                rows = self._sql(
                    switch_role
                    + "SELECT set_config('ibex.org_id', %(org)s, true); "
                    + _RECORD_AND_LEASE,
                    {
                        "org": str(org),
                        "agents": [str(a) for a in agents],
                        "budgets": [int(budgets[a]) for a in agents],
                        "ids": [str(c.session_id) for c in group],
                        "lease": lease_seconds,
                    },
                ).fetchall()
                switch_role = ""
                refs.extend(TurnRef(org, uuid.UUID(str(sid)), int(ti)) for sid, ti in rows)
        return sorted(
            refs,
            key=lambda r: (agent_order[agent_of[r.session_id]], r.turn_index, str(r.session_id)),
        )


__all__ = ["CANDIDATES_SQL", "CANDIDATE_SQL", "CANDIDATE_WHERE", "ScanQueries"]
