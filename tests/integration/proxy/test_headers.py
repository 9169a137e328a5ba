"""The chat path's headers over a real proxy: every refused set is 400 naming the header, an
unknown agent is 404 as the sessions API answers it, every answer says in ``X-IBEX-Recorded``
what was done with the call, and ``X-IBEX-Session-End: true`` completes the session."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from core.db import tenant
from tests.integration.memory_service.helpers import make_token
from tests.integration.proxy.conftest import Org, ProxyServer, wait_for

pytestmark = pytest.mark.integration

HI = [{"role": "user", "content": "I like green tea."}]


def chat(server: ProxyServer, hdrs: dict[str, str]) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": "fake", "messages": HI},
        headers={"Authorization": "Bearer upstream-key", **hdrs},
        timeout=10,
    )


def session_row(store: Any, org: Org, external_id: str) -> tuple[str, int] | None:
    with tenant(store.db, org.org_id):
        row = store.db.execute_sql(
            "SELECT status, turn_count FROM ibex_core.sessions WHERE external_id = %s",
            (external_id,),
        ).fetchone()
    return None if row is None else (str(row[0]), int(row[1]))


REFUSED = [
    ({"X-IBEX-Sesion-ID": "c"}, "UNKNOWN_HEADER", "x-ibex-sesion-id"),
    ({"X-IBEX-Session-ID": "c"}, "INCOMPLETE_HEADERS", "X-IBEX-Session-ID"),
    ({"X-IBEX-Agent": "bot"}, "INCOMPLETE_HEADERS", "X-IBEX-Agent"),
    ({"X-IBEX-Memory": "inject"}, "INCOMPLETE_HEADERS", "X-IBEX-Memory"),
    ({"X-IBEX-User": "dana"}, "INCOMPLETE_HEADERS", "X-IBEX-User"),
    (
        {"X-IBEX-Agent": "bot", "X-IBEX-Memory-Tokens": "40", "X-IBEX-Session-ID": "c"},
        "INCOMPLETE_HEADERS",
        "X-IBEX-Memory-Tokens",
    ),
    (
        {"X-IBEX-Agent": "bot", "X-IBEX-Memory": "inject", "X-IBEX-Session-End": "true"},
        "INCOMPLETE_HEADERS",
        "X-IBEX-Session-End",
    ),
    ({"X-IBEX-Agent": "bot", "X-IBEX-Memory": "yes"}, "INVALID_HEADER", "X-IBEX-Memory"),
    (
        {"X-IBEX-Agent": "bot", "X-IBEX-Memory": "inject", "X-IBEX-Memory-Tokens": "lots"},
        "INVALID_HEADER",
        "X-IBEX-Memory-Tokens",
    ),
    (
        {"X-IBEX-Agent": "bot", "X-IBEX-Session-ID": "c", "X-IBEX-User-ID": "dana"},
        "INVALID_HEADER",
        "X-IBEX-User-ID",
    ),
    (
        {"X-IBEX-Agent": "bot", "X-IBEX-Session-ID": "c", "X-IBEX-Session-End": "soon"},
        "INVALID_HEADER",
        "X-IBEX-Session-End",
    ),
    (
        {"X-IBEX-Agent": "bot", "X-IBEX-Session-ID": ""},
        "INVALID_HEADER",
        "X-IBEX-Session-ID",
    ),
]


@pytest.mark.parametrize(("sent", "code", "named"), REFUSED)
def test_a_refused_header_is_400_naming_it_and_nothing_goes_upstream(
    proxy_server: ProxyServer, upstream: Any, acme: Org, sent: dict[str, str], code: str, named: str
) -> None:
    before = upstream.requests
    answer = chat(proxy_server, {"X-IBEX-Token": acme.token, **sent})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["code"], error["header"]) == (code, named)
    assert named.lower() in error["message"].lower()
    assert answer.headers["X-IBEX-Recorded"] == f"no: refused ({code})"
    assert upstream.requests == before


def test_an_unknown_agent_is_404_and_creates_nothing(
    proxy_server: ProxyServer, upstream: Any, store: Any, acme: Org
) -> None:
    answer = chat(
        proxy_server,
        {"X-IBEX-Token": acme.token, "X-IBEX-Agent": "suport-bot", "X-IBEX-Session-ID": "c"},
    )
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "UNKNOWN_AGENT"
    assert "suport-bot" in answer.json()["error"]["message"]
    with tenant(store.db, acme.org_id):
        agents = store.db.execute_sql(
            "SELECT count(*) FROM ibex_core.agents WHERE slug = 'suport-bot'"
        ).fetchone()
    assert agents == (0,)


def test_a_user_id_that_is_no_user_of_the_org_is_refused(
    proxy_server: ProxyServer, upstream: Any, acme: Org
) -> None:
    hdrs = {
        "X-IBEX-Token": acme.token,
        "X-IBEX-Agent": "bot",
        "X-IBEX-Session-ID": "c",
        "X-IBEX-User-ID": str(uuid.uuid4()),
    }
    answer = chat(proxy_server, hdrs)
    assert (answer.status_code, answer.json()["error"]["code"]) == (400, "INVALID_HEADER")
    assert answer.json()["error"]["header"] == "X-IBEX-User-ID"


def test_every_answer_says_what_was_recorded(
    proxy_server: ProxyServer, upstream: Any, store: Any, worker: Any, acme: Org
) -> None:
    plain = chat(proxy_server, {"X-IBEX-Token": acme.token})
    assert plain.status_code == 200
    assert plain.headers["X-IBEX-Recorded"] == "no: no X-IBEX-Agent and X-IBEX-Session-ID"
    injected = chat(
        proxy_server, {"X-IBEX-Token": acme.token, "X-IBEX-Agent": "bot", "X-IBEX-Memory": "inject"}
    )
    assert injected.headers["X-IBEX-Recorded"] == "no: no X-IBEX-Session-ID"
    recorded = chat(
        proxy_server,
        {"X-IBEX-Token": acme.token, "X-IBEX-Agent": "bot", "X-IBEX-Session-ID": "conv-said"},
    )
    assert recorded.headers["X-IBEX-Recorded"] == "queued"
    proxy_server.settle()
    wait_for(lambda: session_row(store, acme, "conv-said") == ("active", 1), "the turn")


def test_the_session_end_header_completes_the_session_after_its_turn(
    proxy_server: ProxyServer, upstream: Any, store: Any, worker: Any, acme: Org
) -> None:
    user_id = store.resolve_user(acme.org_id, external_id="dana")
    hdrs = {
        "X-IBEX-Token": acme.token,
        "X-IBEX-Agent": "bot",
        "X-IBEX-Session-ID": "conv-end",
        "X-IBEX-User-ID": str(user_id),
        "X-IBEX-Session-End": "true",
    }
    answer = chat(proxy_server, hdrs)
    assert answer.status_code == 200
    assert answer.headers["X-IBEX-Recorded"] == "queued; the session ends"
    proxy_server.settle()
    wait_for(lambda: session_row(store, acme, "conv-end") == ("completed", 1), "completed")
    with tenant(store.db, acme.org_id):
        owner = store.db.execute_sql(
            "SELECT user_id FROM ibex_core.sessions WHERE external_id = 'conv-end'"
        ).fetchone()
    assert owner == (user_id,)


def test_a_turn_the_proxy_could_not_check_is_refused_for_an_unknown_agent(
    store: Any, acme: Org
) -> None:
    """The database was away when the call came: the worker refuses the misspelt agent the
    proxy would have refused, and creates nothing."""
    from sessions.chat import Recording, RecordRefused, spool_message, store_chat_turn

    recording = Recording("suport-bot", "conv-typo", None, acme.org_id, None, None)
    message = spool_message(
        recording,
        request_hash="h",
        model="fake",
        messages=HI,
        completion={"role": "assistant", "content": "Noted."},
        prompt_tokens=1,
        completion_tokens=1,
        latency_ms=1,
        is_streaming=False,
        is_complete=True,
    )
    with pytest.raises(RecordRefused, match="no agent 'suport-bot'"):
        store_chat_turn(store, message)
    with tenant(store.db, acme.org_id):
        agents = store.db.execute_sql(
            "SELECT count(*) FROM ibex_core.agents WHERE slug = 'suport-bot'"
        ).fetchone()
    assert agents == (0,)


def test_a_cookie_the_upstream_sets_is_never_sent_on_a_later_request(
    proxy_server: ProxyServer, upstream: Any, store: Any, db: Any, acme: Org
) -> None:
    # The upstream's client serves every org: a cookie one answer set (a CDN's, as LLM APIs
    # send) must not ride on the next org's request.
    upstream.set_cookie = "__cf_bm=set-for-acme; Path=/; HttpOnly"
    other_org = store.ensure_org("globex")
    other_token, _ = make_token(db, other_org, ["sessions:write", "memory:read"])
    for token in (acme.token, other_token, acme.token):
        assert chat(proxy_server, {"X-IBEX-Token": token}).status_code == 200
    assert upstream.cookies[-3:] == [None, None, None]
