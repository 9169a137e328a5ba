"""What an org's extraction cost: the usage ledger (``ibex_core.turn_usage``, written with each
turn's result by ``ibex_core.persist_result``) summed per model and per day, priced by the
price table (:mod:`core.prices`), with the org's turns counted by state.

Read under row-level security for the org (a tenant transaction), so an org sees its own
figures only. Serves ``GET /v1/usage`` and ``ibex usage``.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, field
from typing import Any

import peewee

from core.db import tenant
from core.prices import PriceTable

_BY_MODEL = """
SELECT provider, model, embedding_model, count(*), COALESCE(sum(llm_calls), 0),
       COALESCE(sum(input_tokens), 0), COALESCE(sum(output_tokens), 0),
       COALESCE(sum(embedding_tokens), 0)
  FROM ibex_core.turn_usage
 WHERE %(since)s::timestamptz IS NULL OR created_at >= %(since)s::timestamptz
 GROUP BY 1, 2, 3 ORDER BY 2, 1, 3
"""

_BY_DAY = """
SELECT (created_at AT TIME ZONE 'UTC')::date, model, embedding_model, count(*),
       COALESCE(sum(llm_calls), 0), COALESCE(sum(input_tokens), 0),
       COALESCE(sum(output_tokens), 0), COALESCE(sum(embedding_tokens), 0)
  FROM ibex_core.turn_usage
 WHERE %(since)s::timestamptz IS NULL OR created_at >= %(since)s::timestamptz
 GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
"""


@dataclass
class Figures:
    """Turns extracted, LLM calls, tokens and their cost in USD."""

    turns: int = 0
    llm_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    embedding_tokens: int = 0
    cost: float = 0.0

    def add(self, other: Figures) -> None:
        self.turns += other.turns
        self.llm_calls += other.llm_calls
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.embedding_tokens += other.embedding_tokens
        self.cost += other.cost

    def as_json(self) -> dict[str, Any]:
        return {
            "turns": self.turns,
            "llm_calls": self.llm_calls,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "embedding_tokens": self.embedding_tokens,
            "cost": round(self.cost, 9),
        }


@dataclass
class UsageSummary:
    """An org's usage since ``since`` (None: ever): the totals, per model, per UTC day, the
    models the price table does not price (counted at 0), and the org's turns by state."""

    org_id: uuid.UUID
    since: dt.datetime | None
    total: Figures = field(default_factory=Figures)
    by_model: list[tuple[str | None, str | None, Figures]] = field(default_factory=list)
    by_day: dict[dt.date, Figures] = field(default_factory=dict)
    unpriced: set[str] = field(default_factory=set)
    states: dict[str, int] = field(default_factory=dict)

    def as_json(self, org: str) -> dict[str, Any]:
        """The answer of ``GET /v1/usage`` and ``ibex usage --json``; ``org`` names the org."""
        return {
            "org": org,
            "org_id": str(self.org_id),
            "since": None if self.since is None else self.since.isoformat(),
            **self.total.as_json(),
            "currency": "USD",
            "by_model": [
                {"provider": provider, "model": model, **f.as_json()}
                for provider, model, f in self.by_model
            ],
            "by_day": [{"day": day.isoformat(), **f.as_json()} for day, f in self.by_day.items()],
            "unpriced_models": sorted(self.unpriced),
            "turn_states": dict(sorted(self.states.items())),
        }


class UsageReader:
    """The ledger's sums for one org at a time, on ``db``."""

    def __init__(self, db: peewee.Database, prices: PriceTable | None = None) -> None:
        self.db = db
        self.prices = prices or PriceTable.from_json(None)

    def _figures(self, row: tuple[Any, ...], models: tuple[str | None, str | None]) -> Figures:
        turns, calls, inp, out, emb = (int(v) for v in row)
        model, embedding_model = models
        cost = self.prices.cost(model, inp, out) + self.prices.cost(embedding_model, emb)
        return Figures(turns, calls, inp, out, emb, cost)

    def _unpriced(self, summary: UsageSummary, *models: str | None) -> None:
        for model in models:
            if model and self.prices.price(model) is None:
                summary.unpriced.add(model)

    def summary(self, org_id: uuid.UUID, since: dt.datetime | None = None) -> UsageSummary:
        summary = UsageSummary(org_id, since)
        with tenant(self.db, org_id):
            by_model = self.db.execute_sql(_BY_MODEL, {"since": since}).fetchall()
            by_day = self.db.execute_sql(_BY_DAY, {"since": since}).fetchall()
            states = self.db.execute_sql(
                "SELECT state, sum(turns) FROM ibex_core.turn_state_counts() GROUP BY state"
            ).fetchall()
        merged: dict[tuple[str | None, str | None], Figures] = {}
        for provider, model, embedding_model, *row in by_model:
            figures = self._figures(tuple(row), (model, embedding_model))
            self._unpriced(summary, model, embedding_model)
            merged.setdefault((provider, model), Figures()).add(figures)
            summary.total.add(figures)
        summary.by_model = [(p, m, f) for (p, m), f in merged.items()]
        for day, model, embedding_model, *row in by_day:
            summary.by_day.setdefault(day, Figures()).add(
                self._figures(tuple(row), (model, embedding_model))
            )
        summary.states = {str(state): int(n) for state, n in states}
        return summary


__all__ = ["Figures", "UsageReader", "UsageSummary"]
