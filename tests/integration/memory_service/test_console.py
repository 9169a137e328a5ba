"""The console at /console over the real Postgres and Redis: sign-in cookie, the CSP, escaping
of stored text, CSRF refusals, the user boundary and who sees the pipeline."""

from __future__ import annotations

import re
import uuid
from typing import Any

import httpx
import pytest

from tests.integration.memory_service.helpers import BASE_URL, Tenant, make_token
from tests.integration.memory_service.test_users_api import auth, bound_token

ALL = ["memory:read", "memory:write", "sessions:read", "sessions:write", "users:delete"]
SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(1)>'
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def sign_in(http: httpx.Client, token: str) -> str:
    """Sign in through the form; the CSRF token of the signed-in pages."""
    page = http.get("/console/signin")
    nonce = CSRF.search(page.text)
    assert page.status_code == 200 and nonce is not None
    answer = http.post(
        "/console/signin", data={"csrf": nonce.group(1), "token": token, "next": "/console"}
    )
    assert answer.status_code == 303, answer.text
    people = http.get("/console/people")
    assert people.status_code == 200, people.text
    found = CSRF.search(people.text)
    assert found is not None
    return found.group(1)


class World:
    """acme's agent: dana's session with a hostile message and hostile memories, grace's
    session and memory."""

    def __init__(self, http: httpx.Client, db: Any, acme: Tenant) -> None:
        self.http, self.acme = http, acme
        self.org = make_token(db, acme.org_id, ALL)[0]
        self.dana_session = self.open("dana-conv", "dana", f"My name is {SCRIPT} {IMG}")
        self.grace_session = self.open("grace-conv", "grace", "I live in Oslo.")
        for content in (SCRIPT, IMG):
            self.remember(content, self.dana_session, "dana")
        self.remember("Grace lives in Oslo.", self.grace_session, "grace")
        self.dana_id = self.http.get(
            f"/v1/sessions/{self.dana_session}", headers=auth(self.org)
        ).json()["user_id"]

    def open(self, external_id: str, user: str, text: str) -> str:
        body = {"agent_id": str(self.acme.agent_id), "external_id": external_id, "user": user}
        opened = self.http.post("/v1/sessions", json=body, headers=auth(self.org))
        assert opened.status_code == 201, opened.text
        turn = {
            "turn_index": 1,
            "messages": [{"role": "user", "content": text}],
            "completion": {"role": "assistant", "content": IMG},
        }
        session = str(opened.json()["id"])
        added = self.http.post(
            f"/v1/sessions/{session}/turns", json={"turns": [turn]}, headers=auth(self.org)
        )
        assert added.status_code == 201, added.text
        return session

    def remember(self, content: str, session: str, user: str) -> None:
        body = {
            "agent_id": str(self.acme.agent_id),
            "content": content,
            "user": user,
            "source": {"session_id": session, "turn_index": 1, "ordinal": 0},
        }
        made = self.http.post("/v1/memories", json=body, headers=auth(self.org))
        assert made.status_code == 201, made.text


@pytest.fixture
def world(http: httpx.Client, db: Any, acme: Tenant) -> World:
    return World(http, db, acme)


def assert_inert(html: str) -> None:
    """Neither attack survives as markup; both are there as text."""
    assert "<script" not in html.lower()
    assert "<img" not in html.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in html


def test_sign_in_keeps_the_token_in_a_strict_http_only_console_cookie(
    http: httpx.Client, world: World
) -> None:
    page = http.get("/console/signin")
    nonce = CSRF.search(page.text)
    assert nonce is not None
    answer = http.post(
        "/console/signin", data={"csrf": nonce.group(1), "token": world.org, "next": "/console"}
    )
    assert answer.status_code == 303
    cookie = next(
        v for k, v in answer.headers.multi_items() if k == "set-cookie" and "ibex_console=" in v
    )
    attributes = {part.strip().lower() for part in cookie.split(";")}
    assert {"httponly", "samesite=strict", "path=/console"} <= attributes
    assert "secure" not in attributes  # plain http here; see the https test
    assert answer.headers["location"] == "/console"


def test_over_https_the_cookie_is_secure(app: Any, world: World) -> None:
    base = BASE_URL.replace("http://", "https://")
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url=base) as https:
        page = https.get("/console/signin")
        nonce = CSRF.search(page.text)
        assert nonce is not None
        answer = https.post("/console/signin", data={"csrf": nonce.group(1), "token": world.org})
    cookies = [v for k, v in answer.headers.multi_items() if k == "set-cookie"]
    assert any("ibex_console=" in c and "Secure" in c for c in cookies)


def test_pages_carry_a_policy_without_script(http: httpx.Client, world: World) -> None:
    sign_in(http, world.org)
    for path in ("/console/people", "/console/conversations", "/console/search", "/console/signin"):
        answer = http.get(path)
        assert answer.status_code == 200, path
        policy = answer.headers["content-security-policy"]
        assert "default-src 'self'" in policy and "script-src 'none'" in policy
        assert "unsafe-inline" not in policy
        assert answer.headers["x-frame-options"] == "DENY"
        assert "<script" not in answer.text


def test_a_signed_out_visit_goes_to_the_sign_in_form(http: httpx.Client, world: World) -> None:
    answer = http.get("/console/people?agent=bot")
    assert answer.status_code == 303
    assert answer.headers["location"].startswith("/console/signin?next=")
    assert http.post("/console/signin", data={"token": world.org}).status_code == 403


def test_a_wrong_token_is_refused_at_sign_in(http: httpx.Client, world: World) -> None:
    page = http.get("/console/signin")
    nonce = CSRF.search(page.text)
    assert nonce is not None
    answer = http.post("/console/signin", data={"csrf": nonce.group(1), "token": "ibex_nope"})
    assert answer.status_code == 401
    assert http.get("/console/people").status_code == 303


def test_stored_text_is_escaped_and_inert_on_every_page(http: httpx.Client, world: World) -> None:
    sign_in(http, world.org)
    person = http.get("/console/person", params={"agent": "bot", "user": "dana"})
    assert person.status_code == 200
    assert_inert(person.text)
    conversation = http.get(f"/console/conversations/{world.dana_session}")
    assert conversation.status_code == 200
    assert_inert(conversation.text)
    found = http.get(
        "/console/search", params={"agent": "bot", "user": "dana", "q": "script alert img"}
    )
    assert found.status_code == 200
    assert_inert(found.text)
    # The query itself, echoed in the form, is text too.
    echoed = http.get("/console/search", params={"agent": "bot", "q": IMG})
    assert "<img" not in echoed.text


def test_forget_needs_the_csrf_token(http: httpx.Client, world: World) -> None:
    csrf = sign_in(http, world.org)
    target = "/console/person/forget?agent=bot&user=grace"
    assert http.post(target, data={}).status_code == 403
    assert http.post(target, data={"csrf": "0" * 64}).status_code == 403
    assert http.get("/console/person?agent=bot&user=grace").status_code == 200
    confirm = http.get(target)
    assert confirm.status_code == 200 and "Forget grace" in confirm.text
    done = http.post(target, data={"csrf": csrf})
    assert done.status_code == 200 and "Forgot grace" in done.text
    assert http.get("/console/person?agent=bot&user=grace").status_code == 404


def test_sign_out_needs_the_csrf_token_and_ends_the_session(
    http: httpx.Client, world: World
) -> None:
    csrf = sign_in(http, world.org)
    assert http.post("/console/signout", data={}).status_code == 403
    assert http.get("/console/people").status_code == 200
    out = http.post("/console/signout", data={"csrf": csrf})
    assert out.status_code == 303
    assert http.get("/console/people").status_code == 303


def test_a_bound_token_sees_its_person_only(
    http: httpx.Client, db: Any, acme: Tenant, world: World
) -> None:
    dana = bound_token(db, acme.org_id, uuid.UUID(world.dana_id), ALL)
    sign_in(http, dana)
    people = http.get("/console/people")
    assert "dana" in people.text and "grace" not in people.text
    assert http.get("/console/person?agent=bot&user=dana").status_code == 200
    grace = http.get("/console/person?agent=bot&user=grace")
    nobody = http.get("/console/person?agent=bot&user=nobody")
    assert grace.status_code == nobody.status_code == 404
    assert grace.text == nobody.text
    theirs = http.get(f"/console/conversations/{world.grace_session}")
    unknown = http.get(f"/console/conversations/{uuid.uuid4()}")
    assert theirs.status_code == unknown.status_code == 404
    assert theirs.text == unknown.text
    listed = http.get("/console/conversations")
    assert "dana-conv" in listed.text and "grace-conv" not in listed.text
    other = http.get("/console/conversations?user=grace")
    assert "grace-conv" not in other.text
    searched = http.get("/console/search", params={"agent": "bot", "user": "grace", "q": "Oslo"})
    assert searched.status_code == 404 and "Grace lives" not in searched.text
    forget = http.get("/console/person/forget?agent=bot&user=grace")
    assert forget.status_code == 404


def test_the_pipeline_is_for_operators_only(
    http: httpx.Client, db: Any, acme: Tenant, world: World
) -> None:
    sign_in(http, world.org)
    assert "/console/pipeline" not in http.get("/console/people").text
    assert http.get("/console/pipeline").status_code == 403
    admin = make_token(db, acme.org_id, ["memory:read", "memory:admin"])[0]
    sign_in(http, admin)
    page = http.get("/console/pipeline")
    assert page.status_code == 200, page.text
    for heading in ("Backlog", "Queues", "Throughput", "Dead letters", "Tokens"):
        assert f"<h2>{heading}</h2>" in page.text


def test_an_admin_revokes_a_token_of_its_org_with_the_csrf_token(
    http: httpx.Client, db: Any, acme: Tenant, globex: Tenant, world: World
) -> None:
    admin = make_token(db, acme.org_id, ["memory:read", "memory:admin"])[0]
    victim, victim_id = make_token(db, acme.org_id, ["memory:read"])
    _, foreign_id = make_token(db, globex.org_id, ["memory:read"])
    csrf = sign_in(http, admin)
    page = http.get("/console/pipeline").text
    assert str(victim_id) in page and str(foreign_id) not in page
    assert (
        http.post("/console/pipeline/revoke", data={"token_id": str(victim_id)}).status_code == 403
    )
    done = http.post("/console/pipeline/revoke", data={"csrf": csrf, "token_id": str(victim_id)})
    assert done.status_code == 200 and "Revoked" in done.text
    other = http.post("/console/pipeline/revoke", data={"csrf": csrf, "token_id": str(foreign_id)})
    assert "No such token" in other.text
    rows = db.execute_sql(
        "SELECT id, revoked_at IS NOT NULL FROM ibex_memory.api_tokens WHERE id IN (%s, %s)",
        (str(victim_id), str(foreign_id)),
    ).fetchall()
    assert {str(r[0]): r[1] for r in rows} == {str(victim_id): True, str(foreign_id): False}
    assert victim


def test_each_turn_shows_the_state_the_turns_route_answers(
    http: httpx.Client, db: Any, acme: Tenant, world: World
) -> None:
    org = make_token(db, acme.org_id, ALL)[0]
    body = {"agent_id": str(acme.agent_id), "external_id": "states", "user": "dana"}
    session = http.post("/v1/sessions", json=body, headers=auth(org)).json()["id"]
    turns = [
        {
            "turn_index": i,
            "messages": [{"role": "user", "content": f"turn {i}"}],
            "completion": {"role": "assistant", "content": "ok"},
        }
        for i in range(1, 7)
    ]
    added = http.post(f"/v1/sessions/{session}/turns", json={"turns": turns}, headers=auth(org))
    assert added.status_code == 201
    rows = [(1, "done", 2), (2, "done", 0), (3, "extracted", 1), (4, "failed", None),
            (5, "pending", None)]  # fmt: skip
    for index, state, count in rows:
        db.execute_sql(
            "INSERT INTO ibex_core.extraction_turns"
            " (org_id, session_id, turn_index, state, result, memory_count)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            (
                str(acme.org_id),
                session,
                index,
                state,
                None if count is None else '{"memories": []}',
                count,
            ),
        )
    db.execute_sql(
        "UPDATE ibex_core.sessions SET last_extracted_turn = 2 WHERE id = %s", (session,)
    )
    listed = http.get(f"/v1/sessions/{session}/turns", headers=auth(org)).json()["items"]
    states = {t["turn_index"]: t["state"] for t in listed}
    assert states == {
        1: "extracted",
        2: "empty",
        3: "extracting",
        4: "dead_lettered",
        5: "pending",
        6: "pending",
    }
    db.execute_sql(
        "INSERT INTO ibex_core.turn_usage (org_id, agent_id, session_id, turn_index, provider,"
        " model, llm_calls, input_tokens, output_tokens) VALUES (%s, %s, %s, 1, 'openai',"
        " 'gpt-4o-mini', 1, 1200, 80)",
        (str(acme.org_id), str(acme.agent_id), session),
    )
    sign_in(http, org)
    page = http.get(f"/console/conversations/{session}").text
    for state in ("extracted", "empty", "extracting", "dead_lettered", "pending"):
        assert f'class="state state-{state}"' in page
    # The usage ledger's row for turn 1, priced by the default table; no other turn has one.
    assert page.count('class="meta cost"') == 1
    assert "1 LLM call · 1200 input + 80 output tokens" in page
