"""Injection of the context block, the database away during a call, and the official OpenAI
SDK pointed at the proxy."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import redis

from cli.stack.processes import free_port
from core.config import Settings
from core.db import tenant
from extraction.prompt import render_turn
from extraction.stages import StageDeps
from memory_service.app import create_app as create_memory_app
from memory_service.app import make_web_pool
from proxy.app import create_app
from sessions.store import SessionStore
from tests.integration.memory_service.helpers import Tenant, make_tenant
from tests.integration.memory_service.test_search import write
from tests.integration.pipeline.helpers import pipeline_settings
from tests.integration.proxy.conftest import (
    REPLY,
    Org,
    ProxyServer,
    redis_worker,
    serve,
    wait_for,
)
from tests.integration.proxy.test_chat_path import SYSTEM, chat, checkpoints

pytestmark = pytest.mark.integration


@pytest.fixture
def memories(
    store: Any, database_url: str, redis_url: str, proxy_db: Any
) -> Iterator[tuple[Tenant, httpx.Client]]:
    """The memory service in-process, and the acme tenant (agent ``bot``) to write through it."""
    tenant_ = make_tenant(store, "acme")
    settings = Settings.from_env({"DATABASE_URL": database_url, "REDIS_URL": redis_url})
    client = redis.Redis.from_url(redis_url)
    app = create_memory_app(settings, db=proxy_db, redis_client=client)
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://m.test") as http:
        yield tenant_, http
    client.close()


def test_injection_puts_memories_into_the_upstream_request_and_not_into_extraction(
    proxy_server: ProxyServer,
    upstream: Any,
    store: Any,
    worker: Any,
    acme: Org,
    memories: tuple[Tenant, httpx.Client],
) -> None:
    tenant_, http = memories
    write(http, tenant_, "Dana is allergic to peanuts.", tenant_.session_id)
    write(http, tenant_, "Dana lives in Lisbon.", tenant_.session_id)
    hdrs = {
        "X-IBEX-Token": acme.token,
        "X-IBEX-Agent": "bot",
        "X-IBEX-Session-ID": "conv-inject",
        "X-IBEX-Memory": "inject",
    }
    messages = [SYSTEM, {"role": "user", "content": "Is Dana allergic to peanuts?"}]
    assert chat(proxy_server, messages, hdrs).status_code == 200
    sent = upstream.bodies[-1]["messages"]
    assert sent[0]["role"] == "system"
    assert sent[0]["content"].startswith(SYSTEM["content"])
    assert "<memories>\n- Dana is allergic to peanuts." in sent[0]["content"]
    assert sent[1:] == messages[1:]

    proxy_server.settle()
    wait_for(lambda: len(checkpoints(store, acme, "conv-inject")) == 1, "the injected turn")
    (turn,) = checkpoints(store, acme, "conv-inject")
    assert "Dana is allergic to peanuts." in turn["messages"][0]["content"]  # as sent upstream
    sessions = SessionStore(store.db, bind_models=False)
    (session,) = sessions.find_sessions("conv-inject", org="acme")
    extracted = render_turn(sessions.read_turn(acme.org_id, session.session_id, 1))
    assert "<memories>" not in extracted and "allergic to peanuts." not in extracted
    assert "Lisbon" not in extracted
    assert "Is Dana allergic" in extracted

    # The next call sends the conversation back without the block: it extends the stored one.
    follow = [*messages, {"role": "assistant", "content": REPLY}, {"role": "user", "content": "ok"}]
    assert chat(proxy_server, follow, hdrs).status_code == 200
    proxy_server.settle()
    wait_for(lambda: len(checkpoints(store, acme, "conv-inject")) == 2, "turn 2")
    assert checkpoints(store, acme, "conv-inject")[1]["messages"] == [follow[-1]]


def test_injection_needs_the_memory_read_scope(
    proxy_server: ProxyServer, upstream: Any, store: Any, db: Any
) -> None:
    from tests.integration.memory_service.helpers import make_token

    org_id = store.ensure_org("acme")
    token, _ = make_token(db, org_id, ["sessions:write"])
    hdrs = {"X-IBEX-Token": token, "X-IBEX-Agent": "bot", "X-IBEX-Memory": "inject"}
    answer = chat(proxy_server, [{"role": "user", "content": "hi"}], hdrs)
    assert answer.status_code == 403
    assert answer.json()["error"]["code"] == "INSUFFICIENT_SCOPE"
    assert upstream.requests == 0


def dead_database_url(database_url: str) -> str:
    """The test database's URL on a port where nothing listens."""
    from urllib.parse import urlparse, urlunparse

    parts = urlparse(database_url)
    netloc = f"{parts.username or 'postgres'}@127.0.0.1:{free_port()}"
    return urlunparse(parts._replace(netloc=netloc))


def test_with_the_database_down_the_call_answers_and_the_turn_lands_later_once(
    proxy_settings: Settings, store: Any, database_url: str, redis_url: str, acme: Org
) -> None:
    dead = make_web_pool(dead_database_url(database_url), max_connections=2)
    app, proxy = create_app(proxy_settings, db=dead, token_cache_seconds=0)
    messages = [SYSTEM, {"role": "user", "content": "The database is away."}]
    hdrs = {"X-IBEX-Token": acme.token, "X-IBEX-Agent": "bot", "X-IBEX-Session-ID": "conv-down"}
    with serve(app, proxy) as server:
        # Without its own Authorization the call would spend the operator's upstream key,
        # which needs a token checked valid: not while the database is away.
        unverified = chat(server, messages, hdrs)
        assert unverified.status_code == 503
        assert unverified.json()["error"]["code"] == "TOKEN_UNVERIFIED"
        server.settle()
        # With its own key the call is answered, and recorded once the database is back.
        hdrs["Authorization"] = "Bearer sk-callers-own"
        answer = chat(server, messages, hdrs)
        assert answer.status_code == 200
        assert answer.json()["choices"][0]["message"]["content"] == REPLY
        assert chat(server, messages, hdrs).status_code == 200  # the client retried
        server.settle()
    assert checkpoints(store, acme, "conv-down") == []

    # The worker starts while the database is still away: the turn is retried, not lost.
    # A retry waits its backoff (1-1.5 s) on the delay queue: its payload stays in the delay
    # queue's hash until then, even once the delay queue's consumer has fetched its id.
    settings = pipeline_settings(
        database_url, redis_url, RETRY_MIN_BACKOFF_MS="1000", RETRY_MAX_BACKOFF_MS="1500"
    )
    down = StageDeps(store=SessionStore(dead, bind_models=False), settings=settings)
    client = redis.Redis.from_url(redis_url)
    with redis_worker(down, redis_url):
        wait_for(lambda: client.hlen("dramatiq:chat_turns.DQ.msgs") >= 1, "a retry of the turn", 30)
        from actors.middleware import install_deps

        install_deps(StageDeps(store=store, settings=settings))  # the database is back
        wait_for(lambda: len(checkpoints(store, acme, "conv-down")) == 1, "the turn", 30)
        wait_for(
            lambda: (
                client.llen("dramatiq:chat_turns.DQ") == 0
                and client.llen("dramatiq:chat_turns") == 0
            ),
            "the spool to drain",
            30,
        )
    client.close()
    (turn,) = checkpoints(store, acme, "conv-down")
    assert turn["messages"] == messages and turn["turn_count"] == 1
    dead.close_all()


def test_the_openai_sdk_works_unchanged_for_both_modes(
    proxy_server: ProxyServer, upstream: Any, store: Any, worker: Any, acme: Org
) -> None:
    client = openai.OpenAI(
        base_url=f"{proxy_server.url}/v1",
        api_key="sk-caller",
        default_headers={
            "X-IBEX-Token": acme.token,
            "X-IBEX-Agent": "support-bot",
            "X-IBEX-Session-ID": f"sdk-{uuid.uuid4()}",
        },
        max_retries=0,
    )
    messages: list[Any] = [{"role": "user", "content": "Hello from the SDK."}]
    answer = client.chat.completions.create(model="fake", messages=messages)
    assert answer.choices[0].message.content == REPLY
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    messages += [
        {"role": "assistant", "content": answer.choices[0].message.content},
        {"role": "user", "content": "Now stream."},
    ]
    stream = client.chat.completions.create(model="fake", messages=messages, stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == REPLY
    client.close()
    proxy_server.settle()
    external_id = client.default_headers["X-IBEX-Session-ID"]
    assert isinstance(external_id, str)
    wait_for(lambda: len(checkpoints(store, acme, external_id)) == 2, "the SDK's turns")
    one, two = checkpoints(store, acme, external_id)
    assert (one["is_streaming"], two["is_streaming"]) == (False, True)
    assert two["messages"] == [{"role": "user", "content": "Now stream."}]
    assert two["is_complete"] is True


def test_a_spooled_turn_whose_token_the_worker_refuses_is_dead_lettered(
    proxy_settings: Settings, store: Any, db: Any, database_url: str, redis_url: str, acme: Org
) -> None:
    from proxy import metrics

    failed = metrics.count("failed")
    dead = make_web_pool(dead_database_url(database_url), max_connections=2)
    app, proxy = create_app(proxy_settings, db=dead, token_cache_seconds=0)
    hdrs = {"X-IBEX-Token": "ibex_forged", "X-IBEX-Agent": "bot", "X-IBEX-Session-ID": "forged"}
    with serve(app, proxy) as server:
        # The token cannot be checked with the database away: a call that would spend the
        # operator's key is refused, one with the caller's own key is answered anyway.
        refused = chat(server, [{"role": "user", "content": "hi"}], hdrs)
        assert refused.status_code == 503
        hdrs["Authorization"] = "Bearer sk-callers-own"
        assert chat(server, [{"role": "user", "content": "hi"}], hdrs).status_code == 200
        server.settle()
    dead.close_all()
    settings = pipeline_settings(database_url, redis_url)
    client = redis.Redis.from_url(redis_url)
    with redis_worker(StageDeps(store=store, settings=settings), redis_url):
        wait_for(lambda: client.zcard("dramatiq:chat_turns.XQ") == 1, "the dead letter")
        wait_for(
            lambda: (
                db.execute_sql(
                    "SELECT count(*) FROM ibex_core.dead_letters"
                    " WHERE actor_name = 'record_chat_turn'"
                ).fetchone()[0]
                == 1
            ),
            "the mirrored dead letter",
        )
    client.close()
    reason = db.execute_sql(
        "SELECT exception_type, exception_message FROM ibex_core.dead_letters"
        " WHERE actor_name = 'record_chat_turn'"
    ).fetchone()
    assert reason == ("RecordRefused", "the call's X-IBEX-Token is unknown or revoked")
    assert metrics.count("failed") == failed + 1
    assert checkpoints(store, acme, "forged") == []


def test_with_redis_hanging_the_call_answers_and_the_lost_turn_is_counted(
    proxy_settings: Settings, proxy_db: Any, acme: Org
) -> None:
    import socket

    from proxy import metrics
    from proxy.spool import DramatiqSpool

    failed = metrics.count("failed")
    # A "Redis" that accepts connections and never answers: the spool write hangs until its
    # timeout.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    port = silent.getsockname()[1]
    spool = DramatiqSpool(f"redis://127.0.0.1:{port}/0", timeout_seconds=2)
    app, proxy = create_app(proxy_settings, db=proxy_db, spool=spool, token_cache_seconds=0)
    hdrs = {"X-IBEX-Token": acme.token, "X-IBEX-Agent": "bot", "X-IBEX-Session-ID": "no-redis"}
    try:
        with serve(app, proxy) as server:
            started = time.monotonic()
            answer = chat(server, [{"role": "user", "content": "hi"}], hdrs)
            elapsed = time.monotonic() - started
            assert answer.status_code == 200 and answer.json()["choices"][0]["message"]
            assert elapsed < 1.0  # the answer did not wait for the spool's 2 s timeout
            server.settle()
    finally:
        silent.close()
    assert metrics.count("failed") == failed + 1


def test_injection_reads_the_named_users_memories_and_no_other_users(
    proxy_server: ProxyServer,
    upstream: Any,
    store: Any,
    worker: Any,
    acme: Org,
    memories: tuple[Tenant, httpx.Client],
) -> None:
    tenant_, http = memories
    for person, fact in (
        ("dana", "Dana is allergic to peanuts."),
        ("eve", "Eve is allergic to shellfish."),
    ):
        user_id = store.resolve_user(tenant_.org_id, external_id=person)
        session, _ = store.open_session(
            tenant_.org_id, agent_id=tenant_.agent_id, external_id=f"src-{person}", user_id=user_id
        )
        write(http, tenant_, fact, session.id, user=person)
    write(http, tenant_, "The shop is allergic to nothing and opens at nine.", tenant_.session_id)
    question = [SYSTEM, {"role": "user", "content": "Who is allergic to peanuts or shellfish?"}]
    base = {"X-IBEX-Token": acme.token, "X-IBEX-Agent": "bot", "X-IBEX-Memory": "inject"}

    assert chat(proxy_server, question, {**base, "X-IBEX-User": "dana"}).status_code == 200
    sent = upstream.bodies[-1]["messages"][0]["content"]
    assert "Dana is allergic to peanuts." in sent
    assert "shellfish" not in sent  # another user's memory
    assert "opens at nine" in sent  # the agent-wide memories are everyone's

    assert chat(proxy_server, question, {**base, "X-IBEX-User": "eve"}).status_code == 200
    sent = upstream.bodies[-1]["messages"][0]["content"]
    assert "Eve is allergic to shellfish." in sent and "peanuts." not in sent

    assert chat(proxy_server, question, base).status_code == 200  # no user: agent-wide only
    sent = upstream.bodies[-1]["messages"][0]["content"]
    assert "opens at nine" in sent and "Dana" not in sent and "Eve" not in sent


def test_a_user_bound_token_reads_and_records_as_its_user_whatever_the_header_says(
    proxy_server: ProxyServer,
    upstream: Any,
    store: Any,
    db: Any,
    worker: Any,
    acme: Org,
    memories: tuple[Tenant, httpx.Client],
) -> None:
    from memories.tokens import TokenStore

    tenant_, http = memories
    users = {}
    for person, fact in (
        ("dana", "Dana is allergic to peanuts."),
        ("eve", "Eve is allergic to shellfish."),
    ):
        users[person] = store.resolve_user(tenant_.org_id, external_id=person)
        session, _ = store.open_session(
            tenant_.org_id,
            agent_id=tenant_.agent_id,
            external_id=f"src-{person}",
            user_id=users[person],
        )
        write(http, tenant_, fact, session.id, user=person)
    _, token = TokenStore(db).issue(
        org_id=tenant_.org_id,
        name="dana's app",
        scopes=["sessions:write", "memory:read"],
        user_id=users["dana"],
    )
    hdrs = {
        "X-IBEX-Token": token,
        "X-IBEX-Agent": "bot",
        "X-IBEX-Session-ID": "conv-bound",
        "X-IBEX-User": "eve",
        "X-IBEX-Memory": "inject",
    }
    question = [SYSTEM, {"role": "user", "content": "Who is allergic to peanuts or shellfish?"}]
    assert chat(proxy_server, question, hdrs).status_code == 200
    sent = upstream.bodies[-1]["messages"][0]["content"]
    assert "Dana is allergic to peanuts." in sent and "shellfish." not in sent
    proxy_server.settle()
    wait_for(lambda: len(checkpoints(store, acme, "conv-bound")) == 1, "the turn")
    with tenant(store.db, tenant_.org_id):
        owner = store.db.execute_sql(
            "SELECT user_id FROM ibex_core.sessions WHERE external_id = 'conv-bound'"
        ).fetchone()
    assert owner is not None and str(owner[0]) == str(users["dana"])
