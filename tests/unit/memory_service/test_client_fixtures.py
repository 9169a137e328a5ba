"""The client tests' fake answers are what the server sends (they run without the server)."""

from __future__ import annotations

from schema.sessions import SessionSchema, TurnsAppendedSchema
from test_ibex_client import appended_json, session_json


def test_the_session_fixtures_are_what_the_server_sends():
    assert SessionSchema().validate(session_json(turn_count=3, last_extracted_turn=1)) == {}
    assert TurnsAppendedSchema().validate(appended_json(2, turn_count=2)) == {}
