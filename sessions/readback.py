"""A session's turns read back: each as recorded, with its extraction state and its usage.

The state and the usage belong to the pipeline's tables (``extraction_turns``, the usage ledger
``turn_usage``), which this domain may not query itself: ``ibex_core.session_turns`` and
``ibex_core.turn_state_counts`` (migration 000022) compute them next to those tables, under
the caller's row-level security, and this module calls them in a tenant transaction.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

import peewee

from core.db import tenant
from core.prices import PriceTable


@dataclass(frozen=True)
class TurnUsage:
    """What extracting the turn cost, counted once with its persisted result."""

    llm_calls: int
    input_tokens: int
    output_tokens: int
    embedding_tokens: int
    latency_ms: int
    provider: str | None
    model: str | None
    embedding_model: str | None
    cost: float


@dataclass(frozen=True)
class RecordedTurn:
    """One turn as recorded, its extraction state (``schema.sessions.TURN_STATES``), the
    failure's class when it failed, the extraction's counts and its usage (None until known)."""

    turn_index: int
    messages: list[dict[str, Any]]
    completion: dict[str, Any]
    state: str
    reason: str | None
    memories: int | None
    superseding: int | None
    reused: bool | None
    usage: TurnUsage | None


def _usage(row: tuple[Any, ...], prices: PriceTable) -> TurnUsage | None:
    calls, inp, out, emb, latency, provider, model, emb_model = row
    if calls is None:
        return None
    cost = prices.cost(model, int(inp), int(out)) + prices.cost(emb_model, int(emb))
    return TurnUsage(
        int(calls), int(inp), int(out), int(emb), int(latency), provider, model, emb_model, cost
    )


class TurnReader:
    """The turns of a session and the org's turns by state, on ``db``."""

    def __init__(self, db: peewee.Database, prices: PriceTable | None = None) -> None:
        self.db = db
        self.prices = prices or PriceTable.from_json(None)

    def turns(
        self, org_id: uuid.UUID, session_id: uuid.UUID, *, after: int, limit: int
    ) -> list[RecordedTurn]:
        """Turns after ``after``, at most ``limit``, in order."""
        with tenant(self.db, org_id):
            rows = self.db.execute_sql(
                "SELECT * FROM ibex_core.session_turns(%s::uuid, %s, %s)",
                (str(session_id), after, limit),
            ).fetchall()
        return [
            RecordedTurn(
                int(r[0]),
                r[1],
                r[2],
                str(r[3]),
                r[4],
                None if r[5] is None else int(r[5]),
                None if r[6] is None else int(r[6]),
                r[7],
                _usage(tuple(r[8:16]), self.prices),
            )
            for r in rows
        ]

    def state_counts(
        self, org_id: uuid.UUID, session_ids: list[uuid.UUID] | None = None
    ) -> dict[uuid.UUID, Counter[str]]:
        """Turns by state per live session of the org (or of ``session_ids``)."""
        with tenant(self.db, org_id):
            rows = self.db.execute_sql(
                "SELECT session_id, state, turns FROM ibex_core.turn_state_counts(%s::uuid[])",
                ([str(s) for s in session_ids] if session_ids is not None else None,),
            ).fetchall()
        counts: dict[uuid.UUID, Counter[str]] = {}
        for sid, state, turns in rows:
            counts.setdefault(uuid.UUID(str(sid)), Counter())[str(state)] += int(turns)
        return counts


__all__ = ["RecordedTurn", "TurnReader", "TurnUsage"]
