"""Deterministic offline extraction of first-person statements (``LLM_PROVIDER=rules``)."""

from __future__ import annotations

from extraction.result import ExtractedMemory
from models.store import Turn

RULES_MODEL = "rules-v1"


def extract_rules(turn: Turn) -> list[ExtractedMemory]:
    return []
