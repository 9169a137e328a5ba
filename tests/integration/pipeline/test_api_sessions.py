"""Sessions fed over the API reach the pipeline exactly as imported ones do, and idle sessions
are closed for it.

The memory service runs in-process (WSGITransport) on its own connection pool; extraction runs
the real stages with the rules extractor through the inline driver of ``ibex extract``,
writing to that service over HTTP.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from cli.extract import InlineReport, drain_inline
from cli.stack.processes import ROOT, Launcher
from core.config import Settings
from extraction.memory_client import MemoryClient
from extraction.providers import make_provider
from extraction.scan_queries import ScanQueries
from extraction.stages import StageDeps, scan
from memory_service.app import create_app, make_pool
from memory_service.tokens.store import TokenStore
from models.importer import import_lines
from models.session_status import SessionStatusStore
from models.store import SessionStore, TurnInput
from tests.integration.pipeline.helpers import pipeline_settings

BASE_URL = "http://memory.test"
LISBON = TurnInput([{"role": "user", "content": "I live in Lisbon."}], {"role": "assistant"})
BIN = Path(sys.executable).parent

CONVERSATION = [
    ("Hi, I'm Dana and I'm allergic to peanuts.", "Noted, Dana!"),
    ("I live in Lisbon with my cat.", "Lovely city."),
    ("I prefer tea over coffee.", "Tea it is."),
    ("Remember that my sister's birthday is on May 3rd.", "I will remember."),
]


def api_turns(first: int, last: int) -> list[dict[str, Any]]:
    return [
        {
            "turn_index": i,
            "messages": [{"role": "user", "content": CONVERSATION[i - 1][0]}],
            "completion": {"role": "assistant", "content": CONVERSATION[i - 1][1]},
            "prompt_tokens": 20 + i,
            "completion_tokens": 5,
            "latency_ms": 600 + i,
        }
        for i in range(first, last + 1)
    ]


def import_line(agent: str, session: str) -> str:
    turns = [{k: v for k, v in t.items() if k != "turn_index"} for t in api_turns(1, 4)]
    return json.dumps({"org": "acme", "agent": agent, "session": session, "turns": turns})


@pytest.fixture
def settings(database_url: str, redis_url: str) -> Settings:
    return pipeline_settings(database_url, redis_url, MEMORY_SERVICE_URL=BASE_URL)


@pytest.fixture
def app(settings: Settings, database_url: str, redis_url: str) -> Iterator[Any]:
    pool = make_pool(database_url, max_connections=4)
    client = redis.Redis.from_url(redis_url)
    yield create_app(settings, db=pool, redis_client=client, token_cache_seconds=0)
    client.close()
    pool.close_all()


@pytest.fixture
def http(app: Any) -> Iterator[httpx.Client]:
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url=BASE_URL) as client:
        yield client


def checkpoints(db: Any, session_id: uuid.UUID | str) -> list[tuple[Any, ...]]:
    """Every stored column of a session's turns but the ids and times, as the owner sees them."""
    return db.execute_sql(
        "SELECT c.turn_index, c.messages_hash, c.completion_hash, c.prompt_tokens,"
        "       c.completion_tokens, c.latency_ms, c.is_streaming, c.is_complete,"
        "       p.messages, p.completion"
        "  FROM ibex_core.checkpoints c"
        "  JOIN ibex_core.checkpoint_payloads p ON p.checkpoint_id = c.id"
        " WHERE c.session_id = %s ORDER BY c.turn_index",
        (str(session_id),),
    ).fetchall()


def test_a_session_fed_over_the_api_is_extracted_like_an_imported_one(  # type: ignore[no-untyped-def]
    http: httpx.Client, app: Any, store: SessionStore, db: Any, settings: Settings
):
    org_id = store.ensure_org("acme")
    tokens = TokenStore(db)
    _, app_token = tokens.issue(
        org_id=org_id, name="app", scopes=["sessions:read", "sessions:write"]
    )
    _, service_token = tokens.issue(
        org_id=None, name="worker", scopes=["memory:read", "memory:write"]
    )
    h = {"Authorization": f"Bearer {app_token}"}
    # Over the API, the way a proxy on the chat path feeds it: in pieces, with a retry.
    opened = http.post(
        "/v1/sessions",
        json={"agent": "api-bot", "external_id": "conv-api", "create_agent": True},
        headers=h,
    )
    assert opened.status_code == 201, opened.text
    api_id = opened.json()["id"]
    for first, last in ((1, 2), (1, 2), (2, 4)):
        response = http.post(
            f"/v1/sessions/{api_id}/turns", json={"turns": api_turns(first, last)}, headers=h
        )
        assert response.status_code in (200, 201), response.text
    assert http.post(f"/v1/sessions/{api_id}/complete", headers=h).status_code == 200
    # The same conversation with `ibex import`, under another agent (memories are deduplicated
    # per agent, so a shared agent would keep only one copy of each).
    report = import_lines(store, [import_line("import-bot", "conv-import")], keep_lines=True)
    assert report.errors == [] and report.turns_added == 4
    imported_id = report.imported[0].session_id

    assert checkpoints(db, api_id) == checkpoints(db, imported_id)
    assert len(checkpoints(db, api_id)) == 4

    memory = MemoryClient(BASE_URL, service_token, transport=httpx.WSGITransport(app=app))
    try:
        deps = StageDeps(
            store=store, settings=settings, provider=make_provider(settings), memory=memory
        )
        scanned = scan(deps)
        inline = InlineReport()
        drain_inline(deps, scanned.sent, inline)
    finally:
        memory.close()
    assert scanned.turns == 8 and inline.failures == [] and inline.turns_done == 8

    def memories(session_id: uuid.UUID | str) -> list[tuple[Any, ...]]:
        page = http.get(
            "/v1/memories",
            params={"session_id": str(session_id), "limit": 200},
            headers={
                "Authorization": f"Bearer {service_token}",
                "X-IBEX-Org-ID": str(org_id),
            },
        ).json()
        assert page["next_cursor"] is None
        return sorted(
            (m["source"]["turn_index"], m["source"]["ordinal"], m["content"], m["kind"])
            for m in page["items"]
        )

    from_api = memories(api_id)
    assert len(from_api) >= 4  # the rules extractor finds something in every turn
    assert from_api == memories(imported_id)
    progress = http.get(f"/v1/sessions/{api_id}", headers=h).json()
    assert progress["progress"] == {"done": 4, "pending": 0, "failed": 0, "pointer": 4}
    assert progress["last_extracted_turn"] == 4


def backdate(db: Any, session_id: uuid.UUID, seconds: int) -> None:
    """Make a session look untouched for ``seconds`` (the touch trigger is bypassed)."""
    with db.atomic():
        db.execute_sql("SET LOCAL session_replication_role = replica")
        db.execute_sql(
            "UPDATE ibex_core.sessions SET updated_at = now() - make_interval(secs => %s)"
            " WHERE id = %s",
            (seconds, str(session_id)),
        )


def status_of(db: Any, session_id: uuid.UUID) -> tuple[str, bool]:
    row = db.execute_sql(
        "SELECT status::text, completed_at IS NOT NULL FROM ibex_core.sessions WHERE id = %s",
        (str(session_id),),
    ).fetchone()
    return row[0], row[1]


@pytest.mark.parametrize(
    ("action", "closed"), [("complete", "completed"), ("abandon", "abandoned")]
)
def test_idle_active_sessions_are_closed(  # type: ignore[no-untyped-def]
    store: SessionStore, db: Any, settings: Settings, action: str, closed: str
):
    """SESSION_IDLE_SECONDS=1: an active session untouched for 5 s is closed with the action;
    a fresh one, a completed one and a deleted one are left as they are. Only a completed
    session is then a scan candidate."""
    orgs = {"acme": store.ensure_org("acme"), "globex": store.ensure_org("globex")}
    sessions: dict[str, uuid.UUID] = {}
    for name, org, status in (
        ("idle", "acme", "active"),
        ("other-org", "globex", "active"),
        ("fresh", "acme", "active"),
        ("done", "acme", "completed"),
        ("deleted", "acme", "active"),
    ):
        org_id = orgs[org]
        session = store.create_session(
            org_id, store.ensure_agent(org_id, "bot"), name, status=status
        )
        store.append_turns(org_id, session.id, [LISBON])
        sessions[name] = session.id
    store.soft_delete_session(orgs["acme"], sessions["deleted"])
    for name in ("idle", "other-org", "done", "deleted"):
        backdate(db, sessions[name], 5)
    idle = Settings.from_env({"SESSION_IDLE_SECONDS": "1", "SESSION_IDLE_ACTION": action.upper()})
    statuses = SessionStatusStore(store.db)
    assert statuses.close_idle(idle.session_idle_seconds, idle.session_idle_action) == 2
    assert status_of(db, sessions["idle"]) == (closed, closed == "completed")
    assert status_of(db, sessions["other-org"]) == (closed, closed == "completed")
    assert status_of(db, sessions["fresh"]) == ("active", False)
    assert status_of(db, sessions["done"]) == ("completed", True)
    assert status_of(db, sessions["deleted"]) == ("active", False)
    # Nothing left to close; the scan sees the idle session only when it was completed.
    assert statuses.close_idle(1, action) == 0
    candidates = {c.session_id for c in ScanQueries(store.db).candidates(100)}
    assert (sessions["idle"] in candidates) == (closed == "completed")
    assert sessions["fresh"] not in candidates


def test_the_scheduler_closes_idle_sessions(  # type: ignore[no-untyped-def]
    store: SessionStore, db: Any, database_url: str, redis_url: str, tmp_path: Path
):
    """The Procfile scheduler line, SESSION_IDLE_SECONDS=1: an idle active session is completed
    before a scan is sent."""
    org_id = store.ensure_org("acme")
    agent_id = store.ensure_agent(org_id, "bot")
    session = store.create_session(org_id, agent_id, "conv-idle", status="active")
    backdate(db, session.id, 5)
    env = {k: v for k, v in os.environ.items() if not k.startswith("IBEX_")}
    env.update(
        {
            "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
            "PYTHONPATH": str(ROOT),
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "SCAN_INTERVAL_SECONDS": "1",
            "SESSION_IDLE_SECONDS": "1",
        }
    )
    with Launcher(tmp_path, cwd=ROOT) as launcher:
        scheduler = launcher.start_procfile("scheduler", env)
        launcher.wait_until(
            lambda: status_of(db, session.id)[0] == "completed",
            "the scheduler did not close the idle session",
            20,
        )
        assert launcher.stop_one(scheduler, grace=10) == 0
