"""A user's session, extracted by real processes (``ibex import``, the memory service under
gunicorn, ``dramatiq actors`` workers, ``ibex scan``, a fake OpenAI-compatible LLM), becomes
memories carrying that user; an agent-wide session's stay agent-wide. Two people saying the
same thing to one agent keep a memory each."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.fake_llm import FakeLLM
from cli.stack.processes import ROOT, Launcher, free_port
from memories.tokens import TokenStore
from tests.integration.procfile_env import procfile_env

pytestmark = [pytest.mark.slow]

BIN = Path(sys.executable).parent
TURNS, MEMORIES = 2, 2
#: (session, user key or None): two people and one agent-wide session, all saying the same.
SESSIONS = [("dana-1", "dana"), ("grace-1", "grace"), ("dana-2", "dana"), ("shared-1", None)]


@pytest.fixture
def stack(db: Any, database_url: str, redis_url: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    _, token = TokenStore(db).issue(org_id=None, name="pipeline", scopes=["memory:write"])
    port = free_port()
    env = procfile_env(
        database_url,
        redis_url,
        port,
        token=token,
        WORKER_THREADS="4",
        MAX_RETRIES="3",
        RETRY_MIN_BACKOFF_MS="50",
        RETRY_MAX_BACKOFF_MS="500",
    )
    with Launcher(tmp_path, cwd=ROOT) as launcher:
        launcher.start_procfile("web", env, bind_host="127.0.0.1")
        llm = FakeLLM(memories=MEMORIES).start()
        env.update({"LLM_PROVIDER": "openai", "LLM_BASE_URL": llm.base_url, "LLM_MODEL": "fake"})
        try:
            launcher.wait_http(f"http://127.0.0.1:{port}/healthz", timeout=20)
            yield {"env": env, "tmp": tmp_path, "launcher": launcher}
        finally:
            llm.stop()


def _ibex(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "ibex"), *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def _write_sessions(path: Path) -> None:
    with path.open("w") as out:
        for session, user in SESSIONS:
            line: dict[str, Any] = {
                "org": "acme",
                "agent": "support-bot",
                "session": session,
                "turns": [
                    {
                        "messages": [{"role": "user", "content": f"I am allergic to item {t}."}],
                        "completion": {"role": "assistant", "content": "Noted."},
                    }
                    for t in range(TURNS)
                ],
            }
            if user is not None:
                line["user"] = user
            out.write(json.dumps(line) + "\n")


def test_a_users_session_is_extracted_into_memories_carrying_the_user(
    stack: dict[str, Any], db: Any
) -> None:
    env, tmp, launcher = stack["env"], stack["tmp"], stack["launcher"]
    data = tmp / "sessions.jsonl"
    _write_sessions(data)
    imported = _ibex(env, "import", str(data))
    assert imported.returncode == 0, imported.stderr
    total = len(SESSIONS) * TURNS
    worker = launcher.start_procfile("worker", env)
    try:
        scan = _ibex(env, "scan", "--json")
        assert scan.returncode == 0, scan.stderr
        assert json.loads(scan.stdout)["turns"] == total
        deadline = time.monotonic() + 60
        while True:
            (pointers,) = db.execute_sql(
                "SELECT COALESCE(sum(last_extracted_turn), 0) FROM ibex_core.sessions"
            ).fetchone()
            if int(pointers) == total:
                break
            assert worker.alive(), worker.log_tail(3000)
            assert time.monotonic() < deadline, worker.log_tail(3000)
            time.sleep(0.5)
    finally:
        launcher.stop_one(worker)

    rows = db.execute_sql(
        "SELECT s.external_id, u.external_id, m.user_id IS NOT DISTINCT FROM s.user_id,"
        "       m.content, m.deleted_at IS NULL"
        "  FROM ibex_memory.memories m"
        "  JOIN ibex_core.sessions s ON s.id = m.session_id"
        "  LEFT JOIN ibex_core.users u ON u.id = m.user_id"
        " ORDER BY 1, 4"
    ).fetchall()
    # Each memory carries its session's user: Dana's, Grace's, and none for the agent-wide
    # session. Dana's two sessions say the same: each of her memories is written once, from
    # whichever session came first, and the other session's slot is answered as its duplicate.
    assert len(rows) == (len(SESSIONS) - 1) * TURNS * MEMORIES
    assert all(same and live for _, _, same, _, live in rows)
    per_user: dict[str | None, int] = {}
    for session, user, *_ in rows:
        assert user == dict(SESSIONS)[session]
        per_user[user] = per_user.get(user, 0) + 1
    assert per_user == {"dana": TURNS * MEMORIES, "grace": TURNS * MEMORIES, None: TURNS * MEMORIES}
    assert db.execute_sql("SELECT count(*) FROM ibex_core.dead_letters").fetchone()[0] == 0
    # The same words from two people and from the agent-wide session are three memories; a
    # person repeating them in a second session is one (the duplicate is the same memory).
    per_content = db.execute_sql(
        "SELECT content, count(DISTINCT id), count(DISTINCT COALESCE(user_id::text, '-'))"
        "  FROM ibex_memory.memories GROUP BY content"
    ).fetchall()
    assert per_content and all(ids == 3 and scopes == 3 for _, ids, scopes in per_content)
    outcomes = dict(
        db.execute_sql(
            "SELECT outcome, count(*) FROM ibex_core.extraction_slots GROUP BY outcome"
        ).fetchall()
    )
    assert outcomes.get("duplicate_content") == TURNS * MEMORIES  # dana-2 repeats dana-1
    # The idempotency key stays the formula over (org, session, turn, ordinal): no user in it.
    from extraction.keys import idempotency_key

    keyed = db.execute_sql(
        "SELECT org_id, session_id, turn_index, ordinal, idempotency_key::text"
        "  FROM ibex_core.extraction_slots"
    ).fetchall()
    assert len(keyed) == total * MEMORIES
    assert all(idempotency_key(o, s, t, n) == key for o, s, t, n, key in keyed)


def _wait_extracted(db: Any, worker: Any, total: int) -> None:
    deadline = time.monotonic() + 90
    while True:
        (pointers,) = db.execute_sql(
            "SELECT COALESCE(sum(last_extracted_turn), 0) FROM ibex_core.sessions"
        ).fetchone()
        if int(pointers) == total:
            return
        assert worker.alive(), worker.log_tail(3000)
        assert time.monotonic() < deadline, worker.log_tail(3000)
        time.sleep(0.5)


def test_two_users_fed_by_import_and_over_the_api_read_only_their_own_memories(
    stack: dict[str, Any], db: Any
) -> None:
    """Dana and Grace each have a session imported and one fed over the sessions API (the
    client); after real workers extract them, every read route, through the client, gives each
    user their memories and the agent-wide ones and never the other's; a read without a user
    gives the agent-wide ones only; a token bound to Dana gets 404 for Grace's session and
    memory; after Dana is forgotten her memories leave every read at once."""
    from ibex_client import IbexClient

    env, tmp, launcher = stack["env"], stack["tmp"], stack["launcher"]
    data = tmp / "sessions.jsonl"
    _write_sessions(data)  # dana-1, grace-1, dana-2 (a repeat of dana-1), shared-1
    imported = _ibex(env, "import", str(data))
    assert imported.returncode == 0, imported.stderr
    org_id = db.execute_sql("SELECT id FROM ibex_core.orgs WHERE slug = 'acme'").fetchone()[0]
    scopes = ["memory:read", "memory:write", "sessions:read", "sessions:write"]
    tokens = TokenStore(db)
    _, app_token = tokens.issue(org_id=org_id, name="app", scopes=[*scopes, "users:delete"])
    _, admin_token = tokens.issue(
        org_id=org_id, name="admin", scopes=["memory:read", "memory:admin"]
    )
    base = env["MEMORY_SERVICE_URL"]
    with contextlib.ExitStack() as clients:
        ibex = clients.enter_context(IbexClient(base, app_token))
        admin = clients.enter_context(IbexClient(base, admin_token))
        _two_users_read_their_own(db, env, launcher, ibex, admin, tokens, org_id, scopes, clients)


def _two_users_read_their_own(
    db: Any,
    env: dict[str, str],
    launcher: Any,
    ibex: Any,
    admin: Any,
    tokens: TokenStore,
    org_id: Any,
    scopes: list[str],
    clients: contextlib.ExitStack,
) -> None:
    from ibex_client import IbexClient, NotFoundError, PermissionDeniedError, Turn

    base = env["MEMORY_SERVICE_URL"]
    # Over the API: one more session each, words of their own.
    for user, words in (("dana", "oat milk"), ("grace", "sea swimming")):
        session = ibex.create_session("support-bot", external_id=f"{user}-api", user=user)
        ibex.append_turns(
            session.id,
            [
                Turn(
                    turn_index=1,
                    messages=[{"role": "user", "content": f"I am allergic to {words}."}],
                    completion={"role": "assistant", "content": "Noted."},
                )
            ],
        )
        ibex.complete_session(session.id)
    total = len(SESSIONS) * TURNS + 2
    worker = launcher.start_procfile("worker", env)
    try:
        scan = _ibex(env, "scan", "--json")
        assert scan.returncode == 0, scan.stderr
        _wait_extracted(db, worker, total)
    finally:
        launcher.stop_one(worker)

    users = dict(db.execute_sql("SELECT external_id, id FROM ibex_core.users").fetchall())
    dana, grace = users["dana"], users["grace"]
    agent = db.execute_sql("SELECT id FROM ibex_core.agents WHERE slug = 'support-bot'").fetchone()[
        0
    ]
    owners = {
        str(m): (str(u) if u else None)
        for m, u in db.execute_sql("SELECT id, user_id FROM ibex_memory.memories").fetchall()
    }
    by_user: dict[str | None, set[str]] = {}
    for memory, owner in owners.items():
        by_user.setdefault(owner, set()).add(memory)
    assert set(by_user) == {str(dana), str(grace), None}

    def reads(client: Any, **who: Any) -> dict[str, set[str]]:
        listed = {str(m.id) for m in client.iter_memories(agent_id=agent, page_size=7, **who)}
        hits = {
            str(h.memory.id) for h in client.search("allergic", agent_id=agent, limit=50, **who)
        }
        context = client.context(agent, query="allergic", max_tokens=4000, **who)
        got = set()
        for memory in owners:
            with contextlib.suppress(NotFoundError):
                got.add(str(client.get_memory(memory, **who).id))
        return {
            "list": listed,
            "search": hits,
            "context": {str(m.memory.id) for m in context.memories},
            "get": got,
        }

    for key, user_id, other in (("dana", dana, grace), ("grace", grace, dana)):
        for who in ({"user": key}, {"user_id": user_id}):
            seen = reads(ibex, **who)
            mine = by_user[str(user_id)] | by_user[None]
            assert seen["list"] == seen["get"] == mine, (key, who)
            for route in ("search", "context"):
                assert seen[route] <= mine and seen[route] & by_user[str(user_id)], (key, route)
                assert not seen[route] & by_user[str(other)], (key, route)
            # The agent-wide memories say what the users said: the context packs one of each
            # near-duplicate pair, the search lists both.
            assert seen["search"] & by_user[None], key
        # The API-fed session's own words are found for its user, and only for them.
        words = "oat" if key == "dana" else "swimming"
        found = ibex.search(words, agent_id=agent, user=key)
        assert found and all(owners[str(h.memory.id)] == str(user_id) for h in found)
        theirs = ibex.search(words, agent_id=agent, user_id=other)
        assert all(owners[str(h.memory.id)] != str(user_id) for h in theirs)
    nobody = reads(ibex)
    assert nobody["list"] == nobody["get"] == by_user[None]
    assert nobody["search"] <= by_user[None] and nobody["context"] <= by_user[None]
    everyone = reads(admin, all_users=True)
    assert everyone["list"] == set(owners)

    # A token bound to Dana: Grace's session and memory are not found on any route.
    _, bound = tokens.issue(org_id=org_id, name="dana", scopes=scopes, user_id=dana)
    as_dana = clients.enter_context(IbexClient(base, bound))
    grace_session = db.execute_sql(
        "SELECT id FROM ibex_core.sessions WHERE external_id = 'grace-api'"
    ).fetchone()[0]
    grace_memory = next(iter(by_user[str(grace)]))
    for call in (
        lambda: as_dana.get_session(grace_session),
        lambda: as_dana.complete_session(grace_session),
        lambda: as_dana.get_memory(grace_memory),
    ):
        with pytest.raises(NotFoundError):
            call()
    assert as_dana.delete_session(grace_session) is False
    assert as_dana.delete_memory(grace_memory) is False
    with pytest.raises(PermissionDeniedError):
        as_dana.search("allergic", agent_id=agent, user="grace")
    assert reads(as_dana)["list"] == by_user[str(dana)] | by_user[None]

    # Forget Dana: her memories leave every read at once.
    forgotten = ibex.forget_user("dana")
    assert forgotten is not None and forgotten.memories == len(by_user[str(dana)])
    after = reads(ibex, user_id=dana)
    assert after["list"] == after["get"] == by_user[None]
    assert not (after["search"] | after["context"]) & by_user[str(dana)]
    assert reads(admin, all_users=True)["list"] == by_user[str(grace)] | by_user[None]
    assert ibex.forget_user("dana") is None
