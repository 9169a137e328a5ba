"""examples/chat_with_memory.py against a fake of the sessions and context API: the calls it
makes in order, its wait for the pipeline, and its answer when the pipeline never catches up."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from examples.chat_with_memory import CONVERSATION, NEXT_QUESTION, run, wait_until_extracted
from ibex_client import IbexClient, Session
from test_ibex_client import AGENT, BASE, SESSION, hit_json, session_json

BLOCK = "<memories>\n- Dana is allergic to peanuts.\n</memories>"


class FakeService:
    """Sessions that the "pipeline" extracts one turn per poll once completed."""

    def __init__(self, *, extracts: bool = True) -> None:
        self.session = session_json()
        self.extracts = extracts
        self.calls: list[tuple[str, str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        path = request.url.path
        self.calls.append((request.method, path, body))
        s = self.session
        if (request.method, path) == ("POST", "/v1/sessions"):
            s["external_id"] = body["external_id"]
            return httpx.Response(201, json=s)
        if path == f"/v1/sessions/{SESSION}/turns":
            before = s["turn_count"]
            s["turn_count"] = max(before, *(t["turn_index"] for t in body["turns"]))
            s["progress"]["pending"] = s["turn_count"] - s["last_extracted_turn"]
            answer = {"session": s, "turns_added": s["turn_count"] - before}
            return httpx.Response(201, json=answer)
        if path == f"/v1/sessions/{SESSION}/complete":
            s["status"] = "completed"
            return httpx.Response(200, json=s)
        if (request.method, path) == ("GET", f"/v1/sessions/{SESSION}"):
            if self.extracts and s["status"] == "completed":
                s["last_extracted_turn"] = min(s["turn_count"], s["last_extracted_turn"] + 1)
                done = s["last_extracted_turn"]
                s["progress"] = {
                    "done": done,
                    "pending": s["turn_count"] - done,
                    "failed": 0,
                    "pointer": done,
                }
            return httpx.Response(200, json=s)
        if path == "/v1/context":
            answer = {"context": BLOCK, "memories": [hit_json()], "tokens": 14, "dropped": 0}
            return httpx.Response(200, json=answer)
        return httpx.Response(404, json={"error": {"code": "NOT_FOUND", "message": path}})


def test_feeds_the_conversation_waits_for_extraction_and_asks_for_context() -> None:
    fake = FakeService()
    waits: list[float] = []
    with IbexClient(BASE, "token", transport=httpx.MockTransport(fake)) as ibex:
        session, context = run(ibex, interval=0.5, sleep=waits.append)
    assert [(m, p) for m, p, _ in fake.calls] == [
        ("POST", "/v1/sessions"),
        ("POST", f"/v1/sessions/{SESSION}/turns"),
        ("POST", f"/v1/sessions/{SESSION}/complete"),
        ("GET", f"/v1/sessions/{SESSION}"),
        ("GET", f"/v1/sessions/{SESSION}"),
        ("POST", "/v1/context"),
    ]
    assert fake.calls[0][2]["agent"] == "support-bot"
    assert fake.calls[0][2]["external_id"].startswith("example-")
    # One person's conversation, and that person's context.
    assert fake.calls[0][2]["user"] == "dana"
    assert [t["turn_index"] for t in fake.calls[1][2]["turns"]] == [1, 2]
    assert fake.calls[-1][2] == {
        "agent_id": str(AGENT),
        "messages": [{"role": "user", "content": NEXT_QUESTION}],
        "max_tokens": 200,
        "user": "dana",
    }
    assert waits == [0.5, 0.5]
    assert context.context == BLOCK
    assert fake.session["last_extracted_turn"] == len(CONVERSATION)
    assert session.extracted and session.progress.done == len(CONVERSATION)


def test_gives_up_with_a_clear_message_when_nothing_extracts() -> None:
    fake = FakeService(extracts=False)
    fake.session.update(status="completed", turn_count=2)
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    with IbexClient(BASE, "token", transport=httpx.MockTransport(fake)) as ibex:
        session = Session.from_json(fake.session)
        with pytest.raises(TimeoutError, match="0 of 2 turns extracted after 5 s"):
            wait_until_extracted(
                ibex, session, timeout=5, interval=1, sleep=sleep, clock=lambda: now[0]
            )
    assert len(fake.calls) == 5


def test_a_failed_turn_stops_the_wait_at_once() -> None:
    fake = FakeService(extracts=False)
    fake.session.update(status="completed", turn_count=2)
    fake.session["progress"] = {"done": 0, "pending": 1, "failed": 1, "pointer": 0}
    waits: list[float] = []
    with IbexClient(BASE, "token", transport=httpx.MockTransport(fake)) as ibex:
        session = Session.from_json(fake.session)
        with pytest.raises(RuntimeError, match="1 turns failed extraction"):
            wait_until_extracted(ibex, session, timeout=60, interval=1, sleep=waits.append)
    assert waits == [] and fake.calls == []
