"""Per-org token budgets (``ibex_core.org_budgets``): set, read and clear them.

A budget is a limit on the LLM tokens (input + output) an org's extraction may use per period,
a calendar month or day in UTC. The pipeline enforces it in its own statements, with no round
trip of its own: ``ibex_core.begin_extract`` refuses the LLM claim of a turn whose org has
spent its budget (the turn waits, ``waiting_for_budget``: no call, no attempt counted, never
dead-lettered), and ``ibex_core.persist_result`` adds each stored result's tokens to the
period's ``used``, in the transaction that stores it, reporting the 80 % and 100 % thresholds
once per period. Since the check is taken when a call is claimed, the calls already in flight
when the limit is reached still finish: the overrun is at most those calls, i.e. at most
``WORKER_PROCESSES x WORKER_THREADS`` calls' tokens.

Setting or clearing a budget recomputes ``used`` for the current period from the usage ledger
and ends the short leases of the org's waiting turns, so the next scan sends them at once.
Written by the owner (the table is not forced under row-level security); the tenant role reads
and counts its own org's row only.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import peewee

from core.db import tenant, transaction
from extraction.turns import TurnStore
from extraction.values import UUIDLike, uuid_text

PERIODS = ("month", "day")

_USED_NOW = """
SELECT COALESCE(sum(u.input_tokens::bigint + u.output_tokens), 0)
  FROM ibex_core.turn_usage u
 WHERE u.org_id = %(org)s::uuid AND u.created_at >= ibex_core.budget_period_start(%(period)s)
"""

_SET = f"""
INSERT INTO ibex_core.org_budgets AS b (org_id, token_limit, period, period_start, used, reported,
                                       updated_at)
VALUES (%(org)s::uuid, %(limit)s, %(period)s, ibex_core.budget_period_start(%(period)s),
        ({_USED_NOW}), 0, now())
ON CONFLICT (org_id) DO UPDATE
   SET token_limit = excluded.token_limit, period = excluded.period,
       period_start = excluded.period_start, used = excluded.used, updated_at = now(),
       reported = CASE WHEN excluded.used >= excluded.token_limit THEN 100
                       WHEN excluded.used * 5 >= excluded.token_limit * 4 THEN 80
                       ELSE 0 END
"""


@dataclass(frozen=True)
class Budget:
    """An org's budget now: its limit, the tokens used in the current period, the period
    and when it started, and the org's turns waiting for it."""

    limit: int
    used: int
    period: str
    period_start: dt.datetime
    waiting_turns: int

    @property
    def spent(self) -> bool:
        return self.used >= self.limit


def budget_json(budget: Budget | None) -> dict[str, Any]:
    """What ``GET /v1/budget`` and ``ibex budget show --json`` answer: the limit, the tokens
    used this period, the period, its start and the turns waiting; no limit and 0 without a
    budget."""
    if budget is None:
        return {"limit": None, "used": 0, "period": None, "period_start": None, "waiting_turns": 0}
    return {
        "limit": budget.limit,
        "used": budget.used,
        "period": budget.period,
        "period_start": budget.period_start.isoformat(),
        "waiting_turns": budget.waiting_turns,
    }


class BudgetStore:
    """Every statement on ``ibex_core.org_budgets`` outside the stage functions, on ``db``."""

    def __init__(self, db: peewee.Database) -> None:
        self.db = db
        self.turns = TurnStore(db)

    def set(self, org_id: UUIDLike, tokens: int, period: str = "month") -> Budget:
        """Set (or replace) the org's budget; waiting turns are sent again if it allows."""
        if period not in PERIODS:
            raise ValueError(f"period must be one of {', '.join(PERIODS)}")
        if tokens < 0:
            raise ValueError("tokens must not be negative")
        org = uuid_text(org_id)
        with transaction(self.db):
            # The org set for this transaction: the ledger (forced under row-level security,
            # even for its owner) shows the org's rows to the sum.
            self.db.execute_sql("SELECT set_config('ibex.org_id', %s, true)", (org,))
            self.db.execute_sql(_SET, {"org": org, "limit": tokens, "period": period})
        self.turns.release_budget_waits(org)
        budget = self.get(org)
        assert budget is not None
        return budget

    def clear(self, org_id: UUIDLike) -> bool:
        """Remove the org's budget (no limit); its waiting turns are sent again."""
        org = uuid_text(org_id)
        with transaction(self.db):
            gone = self.db.execute_sql(
                "DELETE FROM ibex_core.org_budgets WHERE org_id = %s::uuid", (org,)
            ).rowcount
        self.turns.release_budget_waits(org)
        return bool(gone)

    def get(self, org_id: UUIDLike) -> Budget | None:
        """The org's budget as the pipeline counts it (a period that turned has used 0), or
        None when it has none. Under row-level security for the org."""
        with tenant(self.db, org_id):
            row = self.db.execute_sql(
                "SELECT b.token_limit, CASE WHEN b.period_start ="
                "       ibex_core.budget_period_start(b.period) THEN b.used ELSE 0 END,"
                "       b.period, ibex_core.budget_period_start(b.period),"
                "       (SELECT count(*) FROM ibex_core.extraction_turns e"
                "         WHERE e.waiting_for_budget AND e.state = 'pending')"
                "  FROM ibex_core.org_budgets b WHERE b.org_id = %s::uuid",
                (uuid_text(org_id),),
            ).fetchone()
        if row is None:
            return None
        limit, used, period, start, waiting = row
        return Budget(int(limit), int(used), str(period), start, int(waiting))


__all__ = ["PERIODS", "Budget", "BudgetStore"]
