"""Payloads of the usage route (``GET /v1/usage``): its query and its answer. No I/O here."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from marshmallow import RAISE, Schema, ValidationError, fields

#: ``since``: a calendar day, ``YYYY-MM-DD`` (UTC midnight), nothing else.
DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


def parse_day(text: str) -> dt.datetime:
    """``YYYY-MM-DD`` as UTC midnight; ValueError for anything else."""
    if not DAY.fullmatch(text):
        raise ValueError(text)
    if text.startswith("0000-"):
        text = "0001-01-01"  # before any usage: from the first day there is
    return dt.datetime.combine(dt.date.fromisoformat(text), dt.time(), dt.UTC)


class Day(fields.Field[dt.datetime]):
    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> dt.datetime:
        if not isinstance(value, str):
            raise ValidationError("must be a day, YYYY-MM-DD")
        try:
            return parse_day(value)
        except ValueError:
            raise ValidationError("must be a day, YYYY-MM-DD") from None


class UsageQuerySchema(Schema):
    """Query parameters of ``GET /v1/usage``."""

    class Meta:
        unknown = RAISE

    since = Day(
        metadata={
            "type": "string",
            "format": "date",
            "description": "Count from this day (UTC, YYYY-MM-DD); absent: ever.",
        }
    )


class FiguresSchema(Schema):
    class Meta:
        unknown = RAISE

    turns = fields.Integer(required=True, metadata={"description": "Turns extracted."})
    llm_calls = fields.Integer(required=True)
    input_tokens = fields.Integer(required=True)
    output_tokens = fields.Integer(required=True)
    embedding_tokens = fields.Integer(required=True)
    cost = fields.Float(required=True, metadata={"description": "USD, by the price table."})


class ModelFiguresSchema(FiguresSchema):
    provider = fields.String(required=True, allow_none=True)
    model = fields.String(required=True, allow_none=True)


class DayFiguresSchema(FiguresSchema):
    day = fields.Date(required=True)


class UsageSchema(FiguresSchema):
    """The org's usage: totals, per model, per UTC day, and its turns by state."""

    org = fields.String(required=True, metadata={"description": "The org's id."})
    org_id = fields.UUID(required=True)
    since = fields.AwareDateTime(required=True, allow_none=True)
    currency = fields.String(required=True)
    by_model = fields.List(fields.Nested(ModelFiguresSchema), required=True)
    by_day = fields.List(fields.Nested(DayFiguresSchema), required=True)
    unpriced_models = fields.List(
        fields.String(),
        required=True,
        metadata={"description": "Models the price table does not price (counted at 0)."},
    )
    turn_states = fields.Dict(
        keys=fields.String(),
        values=fields.Integer(),
        required=True,
        metadata={"description": "The org's turns by extraction state."},
    )


class BudgetSchema(Schema):
    """The org's token budget: its limit per period, the tokens used in the current one, and
    the turns waiting for it (``limit`` null: no budget)."""

    class Meta:
        unknown = RAISE

    limit = fields.Integer(required=True, allow_none=True)
    used = fields.Integer(
        required=True, metadata={"description": "LLM tokens (input + output) this period."}
    )
    period = fields.String(required=True, allow_none=True)
    period_start = fields.AwareDateTime(required=True, allow_none=True)
    waiting_turns = fields.Integer(required=True)


__all__ = ["BudgetSchema", "UsageQuerySchema", "UsageSchema", "parse_day"]
