"""What tokens cost: a price per model, in USD per million tokens, input and output.

The default table holds list prices of common hosted models (as published when this table was
written; check your provider's page); ``LLM_PRICES`` (JSON) adds models or overrides them:
``{"my-model": {"input": 0.5, "output": 1.5}}``. An embedding model is priced by its
``input``. A model in neither (a local model, the offline ``rules`` extractor) costs 0 and is
reported as unpriced, so a figure is never silently made up.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from core.errors import ConfigError

PRICES_VARIABLE = "LLM_PRICES"


@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input: float
    output: float = 0.0


#: Default prices, USD per million tokens (input, output).
DEFAULT_PRICES: dict[str, Price] = {
    "gpt-4o-mini": Price(0.15, 0.60),
    "gpt-4o": Price(2.50, 10.00),
    "gpt-4.1": Price(2.00, 8.00),
    "gpt-4.1-mini": Price(0.40, 1.60),
    "gpt-4.1-nano": Price(0.10, 0.40),
    "o4-mini": Price(1.10, 4.40),
    "text-embedding-3-small": Price(0.02),
    "text-embedding-3-large": Price(0.13),
    # The offline extractor calls no LLM.
    "rules": Price(0.0, 0.0),
}


def _rate(model: str, field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(
            f"{PRICES_VARIABLE}: {model}.{field} must be a number", variable=PRICES_VARIABLE
        )
    if value < 0:
        raise ConfigError(
            f"{PRICES_VARIABLE}: {model}.{field} must not be negative", variable=PRICES_VARIABLE
        )
    return float(value)


def parse_prices(raw: str | None) -> dict[str, Price]:
    """The default table with ``raw`` (the JSON of ``LLM_PRICES``) laid over it; a malformed
    value is a :class:`ConfigError` naming the variable."""
    table = dict(DEFAULT_PRICES)
    if not raw:
        return table
    try:
        data = json.loads(raw)
    except ValueError:
        raise ConfigError(f"{PRICES_VARIABLE} must be JSON", variable=PRICES_VARIABLE) from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{PRICES_VARIABLE} must be a JSON object of models", variable=PRICES_VARIABLE
        )
    for model, entry in data.items():
        if not isinstance(entry, dict) or not set(entry) <= {"input", "output"} or not entry:
            raise ConfigError(
                f'{PRICES_VARIABLE}: {model} must be {{"input": N, "output": N}}',
                variable=PRICES_VARIABLE,
            )
        table[model] = Price(
            _rate(model, "input", entry.get("input", 0)),
            _rate(model, "output", entry.get("output", 0)),
        )
    return table


def _bare(model: str) -> str:
    """``openai:text-embedding-3-small`` → ``text-embedding-3-small``."""
    return model.split(":", 1)[1] if ":" in model else model


@dataclass(frozen=True)
class PriceTable:
    prices: Mapping[str, Price]

    @classmethod
    def from_json(cls, raw: str | None) -> PriceTable:
        return cls(parse_prices(raw))

    def price(self, model: str | None) -> Price | None:
        if not model:
            return None
        return self.prices.get(model) or self.prices.get(_bare(model))

    def cost(self, model: str | None, input_tokens: int, output_tokens: int = 0) -> float:
        """USD for these tokens of ``model``; 0 for a model the table does not price."""
        price = self.price(model)
        if price is None:
            return 0.0
        return (input_tokens * price.input + output_tokens * price.output) / 1_000_000


__all__ = ["DEFAULT_PRICES", "PRICES_VARIABLE", "Price", "PriceTable", "parse_prices"]
