"""The client agrees with the server: its tests' fake answers are what the server sends (those
tests run without the server), its request bodies are the server's canonical JSON and its
memory kinds the server's."""

from __future__ import annotations

import uuid

from core.canonical import canonical_json
from ibex_client import canonical_body
from ibex_client.types import MEMORY_KINDS as CLIENT_KINDS
from schema.memory import MEMORY_KINDS
from schema.sessions import SessionSchema, TurnsAppendedSchema
from test_ibex_client import appended_json, session_json


def test_the_session_fixtures_are_what_the_server_sends():
    assert SessionSchema().validate(session_json(turn_count=3, last_extracted_turn=1)) == {}
    assert TurnsAppendedSchema().validate(appended_json(2, turn_count=2)) == {}


def test_the_client_sends_the_servers_canonical_json():
    body = {"b": [1, {"é": None}], "a": uuid.UUID(int=1)}
    assert canonical_body(body) == canonical_json(body, default=str).encode("utf-8")


def test_the_client_knows_the_servers_memory_kinds():
    # Defined once for the server (schema.memory); the client, which imports nothing of the
    # server, keeps its own copy, and this keeps the two equal.
    assert CLIENT_KINDS == MEMORY_KINDS
