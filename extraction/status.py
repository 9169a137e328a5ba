"""``ibex status``: the extraction backlog per org and in total.

Read as the operator role (every org, read only). Turn counts partition the unextracted turns
of completed sessions (everything above each session's pointer):

- ``pending``: not yet sent, or sent and its lease expired (the next scan sends it);
- ``in_flight``: sent under a live lease;
- ``waiting``: done, but above an earlier turn that is not done yet (the pointer waits);
- ``failed``: dead-lettered, blocking its session's pointer until replayed.

``done`` counts every turn the pipeline has finished whose state ``ibex prune`` has not
deleted; ``pointer_lag`` is the number of turns
above the pointers, i.e. the sum of the four above.

The queues' own counts come from the broker's side (``extraction.queues``), passed in as a
function: this module reads Postgres only. The table for terminals is ``cli/status.py``'s.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import peewee

from core.db import operator_scope
from extraction import deadletter_rows
from extraction.scan_queries import CANDIDATE_WHERE

BACKLOG_SQL = f"""
WITH candidates AS (
    SELECT s.id, s.org_id, s.last_extracted_turn, s.turn_count, s.completed_at, s.updated_at
      FROM ibex_core.sessions s
     WHERE {CANDIDATE_WHERE}
), above AS (
    SELECT c.org_id, c.id AS session_id, t.state, t.lease_expires_at, t.created_at
      FROM candidates c
      JOIN ibex_core.extraction_turns t
        ON t.session_id = c.id AND t.turn_index > c.last_extracted_turn
)
SELECT o.id, o.slug,
       (SELECT count(*) FROM candidates c WHERE c.org_id = o.id),
       (SELECT coalesce(sum(c.turn_count - c.last_extracted_turn), 0)
          FROM candidates c WHERE c.org_id = o.id),
       (SELECT count(*) FROM above a WHERE a.org_id = o.id AND a.state <> 'done'
           AND a.state <> 'failed' AND a.lease_expires_at > now()),
       (SELECT count(*) FROM above a WHERE a.org_id = o.id AND a.state = 'done'),
       (SELECT count(*) FROM above a WHERE a.org_id = o.id AND a.state = 'failed'),
       (SELECT count(DISTINCT a.session_id) FROM above a
         WHERE a.org_id = o.id AND a.state = 'failed'),
       (SELECT count(*) FROM ibex_core.extraction_turns t
         WHERE t.org_id = o.id AND t.state = 'done'),
       (SELECT min(coalesce(c.completed_at, c.updated_at)) FROM candidates c
         WHERE c.org_id = o.id),
       (SELECT coalesce(sum(t.llm_calls), 0) FROM ibex_core.extraction_turns t
         WHERE t.org_id = o.id AND t.updated_at > now() - interval '1 hour'),
       (SELECT coalesce(sum(t.prompt_tokens + t.completion_tokens), 0)
          FROM ibex_core.extraction_turns t
         WHERE t.org_id = o.id AND t.extracted_at > now() - interval '1 hour'),
       (SELECT count(*) FROM ibex_memory.memories m
         WHERE m.org_id = o.id AND m.deleted_at IS NULL),
       -- Repeated inputs (000014): turns whose result was reused, with no LLM call.
       (SELECT count(*) FROM ibex_core.extraction_turns t WHERE t.org_id = o.id AND t.reused)
  FROM ibex_core.orgs o
 ORDER BY o.slug
"""


@dataclass
class OrgBacklog:
    org_id: str
    org: str
    sessions_pending: int = 0
    turns_pending: int = 0
    turns_in_flight: int = 0
    turns_waiting: int = 0
    turns_failed: int = 0
    turns_done: int = 0
    pointer_lag: int = 0
    sessions_blocked: int = 0
    oldest_pending_age_seconds: float | None = None
    llm_calls_last_hour: int = 0
    tokens_last_hour: int = 0
    memories: int = 0
    #: Turns whose LLM input was identical to one already extracted in the same scope: they
    #: reused its result and cost no LLM call (still in the table: not pruned yet).
    turns_reused: int = 0


_SUMMED = (
    "sessions_pending",
    "turns_pending",
    "turns_in_flight",
    "turns_waiting",
    "turns_failed",
    "turns_done",
    "pointer_lag",
    "sessions_blocked",
    "llm_calls_last_hour",
    "tokens_last_hour",
    "memories",
    "turns_reused",
)


@dataclass
class Status:
    orgs: list[OrgBacklog]
    total: dict[str, Any]
    queues: dict[str, dict[str, int]] = field(default_factory=dict)
    generated_at: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "generated_at": self.generated_at,
            "total": self.total,
            "orgs": [asdict(o) for o in self.orgs],
            "queues": self.queues,
        }


#: Reads the broker's counts of the named queues: ``{queue: {"ready": n, ...}}``.
QueueCounts = Callable[[Iterable[str]], dict[str, dict[str, int]]]


def collect(
    db: peewee.Database,
    queue_counts: QueueCounts | None,
    *,
    queues: list[str],
) -> Status:
    """The backlog per org and in total, and per queue (``queues`` and every queue with an open
    dead letter in the mirror) the mirror's open dead letters, with ``queue_counts``' figures
    when it is given (None: Postgres only)."""
    now = dt.datetime.now(dt.UTC)
    with operator_scope(db):
        rows = db.execute_sql(BACKLOG_SQL).fetchall()
    mirror = deadletter_rows.open_by_queue(db)
    orgs = []
    for (
        org_id,
        slug,
        sessions,
        lag,
        in_flight,
        waiting,
        failed,
        blocked,
        done,
        oldest,
        calls,
        tokens,
        memories,
        reused,
    ) in rows:
        pending = int(lag) - int(in_flight) - int(waiting) - int(failed)
        orgs.append(
            OrgBacklog(
                org_id=str(org_id),
                org=slug,
                sessions_pending=int(sessions),
                turns_pending=pending,
                turns_in_flight=int(in_flight),
                turns_waiting=int(waiting),
                turns_failed=int(failed),
                turns_done=int(done),
                pointer_lag=int(lag),
                sessions_blocked=int(blocked),
                oldest_pending_age_seconds=(
                    round((now - oldest).total_seconds(), 1) if oldest else None
                ),
                llm_calls_last_hour=int(calls),
                tokens_last_hour=int(tokens),
                memories=int(memories),
                turns_reused=int(reused),
            )
        )
    total: dict[str, Any] = {name: sum(getattr(o, name) for o in orgs) for name in _SUMMED}
    ages = [o.oldest_pending_age_seconds for o in orgs if o.oldest_pending_age_seconds is not None]
    total["oldest_pending_age_seconds"] = max(ages) if ages else None
    names = sorted(set(queues) | set(mirror))
    counts = queue_counts(names) if queue_counts is not None else {}
    queue_stats: dict[str, dict[str, int]] = {
        name: {**counts.get(name, {}), "dead_mirror": int(mirror.get(name, 0))} for name in names
    }
    return Status(orgs, total, queue_stats, now.isoformat())


THROUGHPUT_SQL = """
SELECT floor(extract(epoch FROM now() - t.updated_at) / 60)::int AS minutes_ago, count(*)
  FROM ibex_core.extraction_turns t
 WHERE t.state = 'done' AND t.updated_at > now() - make_interval(mins => %s)
   AND (%s::uuid IS NULL OR t.org_id = %s::uuid)
 GROUP BY 1
"""


def throughput(db: peewee.Database, minutes: int, org_id: str | None = None) -> list[int]:
    """Turns finished in each of the last ``minutes`` minutes, the current minute first (every
    org's, or ``org_id``'s); read as the operator role."""
    with operator_scope(db):
        rows = db.execute_sql(THROUGHPUT_SQL, (minutes, org_id, org_id)).fetchall()
    counts = [0] * minutes
    for ago, count in rows:
        if 0 <= int(ago) < minutes:
            counts[int(ago)] = int(count)
    return counts


__all__ = ["BACKLOG_SQL", "OrgBacklog", "QueueCounts", "Status", "collect", "throughput"]
