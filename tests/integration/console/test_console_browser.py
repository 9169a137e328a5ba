"""The console in a real headless Chromium (Debian's ``chromium``, driven by Playwright; nothing
downloaded), on a stack that extracts real turns: the Procfile's ``web`` and ``worker`` lines,
the rules extractor, ``ibex scan``. Signs in, walks every page, forgets a person, replays a
dead letter and sees it land once, and checks that a bound token cannot open another person's
page and that stored script never runs.

Skipped when chromium or playwright is missing, except under ``CI=true`` where that fails.
With ``IBEX_CONSOLE_SCREENSHOTS=1`` the screenshots go to docs/console/ (for the docs);
otherwise into the test's temporary folder, so an ordinary run leaves the tree clean.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.stack.processes import ROOT, Launcher, Process, free_port
from memories.tokens import TokenStore
from tests.integration.procfile_env import procfile_env

pytestmark = [pytest.mark.slow]

BIN = Path(sys.executable).parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ALL = ["memory:read", "memory:write", "sessions:read", "sessions:write", "users:delete"]
XSS_SCRIPT = "<script>window.__xss = 1</script>"
XSS_IMG = '"><img src=x onerror="window.__xss = 2">'


def _missing(what: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is missing (CI=true: the browser test must run)")
    pytest.skip(f"{what} is missing")


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright (pip)")
    if not os.access(CHROMIUM, os.X_OK):
        _missing("chromium (apt-get install chromium)")
    with sync_playwright() as driver:
        browser = driver.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        try:
            yield browser
        finally:
            browser.close()


def screenshots(tmp_path: Path) -> Path:
    if os.environ.get("IBEX_CONSOLE_SCREENSHOTS") == "1":
        folder = ROOT / "docs" / "console"
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    return tmp_path


class Stack:
    """web + worker over the test database, and an org with an admin token."""

    def __init__(self, launcher: Launcher, env: dict[str, str], db: Any) -> None:
        self.launcher, self.env, self.db = launcher, env, db
        self.base = env["MEMORY_SERVICE_URL"]
        tokens = TokenStore(db)
        self.org_id = tokens.ensure_org("acme")
        self.admin = tokens.issue(
            org_id=self.org_id, name="console admin", scopes=[*ALL, "memory:admin"]
        )[1]
        self.worker: Process | None = None
        self.agent_id = ""

    def start_worker(self, token: str) -> None:
        if self.worker is not None:
            self.launcher.stop_one(self.worker)
        self.worker = self.launcher.start_procfile(
            "worker", {**self.env, "MEMORY_SERVICE_TOKEN": token}
        )

    def api(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        answer = httpx.request(
            method,
            self.base + path,
            json=body,
            headers={"Authorization": f"Bearer {self.admin}"},
            timeout=10,
        )
        assert answer.status_code < 300, answer.text
        return dict(answer.json())

    def conversation(self, external_id: str, user: str, *texts: str) -> str:
        opened = self.api(
            "POST",
            "/v1/sessions",
            {"agent": "bot", "create_agent": True, "external_id": external_id, "user": user},
        )
        turns = [
            {
                "turn_index": i,
                "messages": [{"role": "user", "content": text}],
                "completion": {"role": "assistant", "content": "Noted."},
            }
            for i, text in enumerate(texts, start=1)
        ]
        self.api("POST", f"/v1/sessions/{opened['id']}/turns", {"turns": turns})
        self.api("POST", f"/v1/sessions/{opened['id']}/complete")
        self.agent_id = str(opened["agent_id"])
        return str(opened["id"])

    def scan(self) -> None:
        done = subprocess.run(
            [str(BIN / "ibex"), "scan"],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr

    def extracted(self, session_id: str) -> bool:
        row = self.db.execute_sql(
            "SELECT last_extracted_turn = turn_count FROM ibex_core.sessions WHERE id = %s",
            (session_id,),
        ).fetchone()
        return bool(row and row[0])

    def wait_extracted(self, *session_ids: str) -> None:
        self.launcher.wait_until(
            lambda: all(self.extracted(s) for s in session_ids), "extraction", timeout=60
        )

    def dead_letters(self) -> int:
        return int(
            self.db.execute_sql(
                "SELECT count(*) FROM ibex_core.dead_letters"
                " WHERE replayed_at IS NULL AND purged_at IS NULL"
            ).fetchone()[0]
        )


@pytest.fixture
def stack(db: Any, database_url: str, redis_url: str, tmp_path: Path) -> Iterator[Stack]:
    port = free_port()
    env = procfile_env(
        database_url,
        redis_url,
        port,
        strip=("EMBED",),
        MAX_RETRIES="2",
        RETRY_MIN_BACKOFF_MS="50",
        RETRY_MAX_BACKOFF_MS="200",
        LLM_PROVIDER="rules",
        EMBEDDINGS_PROVIDER="none",
    )
    with Launcher(tmp_path, cwd=ROOT) as launcher:
        launcher.start_procfile("web", env, bind_host="127.0.0.1")
        launcher.wait_http(f"http://127.0.0.1:{port}/healthz", timeout=30)
        yield Stack(launcher, env, db)


def sign_in(page: Any, base: str, token: str) -> None:
    page.goto(base + "/console")
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")
    page.wait_for_url("**/console/people*")


def test_the_console_in_a_browser(stack: Stack, chromium: Any, db: Any, tmp_path: Path) -> None:
    shots = screenshots(tmp_path)
    tokens = TokenStore(db)
    good = tokens.issue(org_id=None, name="pipeline", scopes=["memory:write", "memory:read"])[1]
    bad = tokens.issue(org_id=None, name="read only", scopes=["memory:read"])[1]
    stack.start_worker(good)
    dana = stack.conversation(
        "dana-1",
        "dana",
        "Hi, my name is Dana and I live in Lisbon.",
        "I love green tea.",
        f"I'm allergic to peanuts. {XSS_SCRIPT} {XSS_IMG}",
    )
    grace = stack.conversation("grace-1", "grace", "I live in Oslo.", "I love skiing.")
    erin = stack.conversation("erin-1", "erin", "I work at the harbour.")
    stack.scan()
    stack.wait_extracted(dana, grace, erin)
    moved = stack.conversation("dana-2", "dana", "I moved to Porto.")
    stack.scan()
    stack.wait_extracted(moved)
    # A memory whose text is hostile, written through the API.
    stack.api(
        "POST",
        "/v1/memories",
        {
            "agent_id": stack.agent_id,
            "user": "dana",
            "content": f"Likes {XSS_SCRIPT} and {XSS_IMG}",
        },
    )
    # A dead letter: a worker whose token may not write memories.
    stack.start_worker(bad)
    late = stack.conversation("dana-3", "dana", "I'm a big fan of jazz.")
    stack.scan()
    stack.launcher.wait_until(lambda: stack.dead_letters() >= 1, "a dead letter", timeout=60)
    stack.start_worker(good)

    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    base = stack.base
    sign_in(page, base, stack.admin)
    (cookie,) = [c for c in context.cookies() if c["name"] == "ibex_console"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/console"
    shown = page.goto(base + "/console/people")
    assert shown is not None
    assert "script-src 'none'" in shown.headers["content-security-policy"]
    assert page.locator("text=dana").first.is_visible()
    page.screenshot(path=str(shots / "people.png"), full_page=True)

    page.click("text=dana")
    page.wait_for_url("**/console/person?*")
    assert page.locator("text=The user is allergic to peanuts").count() >= 1
    assert page.locator("text=History").count() >= 1  # Lisbon, superseded by Porto
    page.screenshot(path=str(shots / "person.png"), full_page=True)

    page.click("text=Conversations")
    page.wait_for_url("**/console/conversations*")
    assert page.locator("text=grace-1").count() == 1
    page.screenshot(path=str(shots / "conversations.png"), full_page=True)
    page.click("text=dana-1")
    page.wait_for_url(f"**/console/conversations/{dana}*")
    assert page.locator(".state-extracted").count() == 3, page.inner_text("main")[:500]
    assert page.locator(f"text={XSS_SCRIPT}").count() >= 1  # shown as text
    page.screenshot(path=str(shots / "conversation.png"), full_page=True)

    page.click("text=Search")
    page.fill("input[name=user]", "dana")
    page.fill("input[name=q]", "what is Dana allergic to?")
    page.click("button:has-text('Search')")
    page.wait_for_url("**/console/search?*")
    assert page.locator("pre.context").inner_text().startswith("<memories>")
    assert page.locator("text=peanuts").count() >= 1
    page.screenshot(path=str(shots / "search.png"), full_page=True)

    page.click("text=Pipeline")
    page.wait_for_url("**/console/pipeline*")
    assert page.locator("button:has-text('Replay')").count() == 1
    page.screenshot(path=str(shots / "pipeline.png"), full_page=True)
    page.click("button:has-text('Replay')")
    assert page.locator("text=replayed 1").count() == 1
    stack.wait_extracted(late)
    slots = db.execute_sql(
        "SELECT turn_index, ordinal, count(*) FROM ibex_memory.memories"
        " WHERE session_id = %s AND deleted_at IS NULL GROUP BY 1, 2",
        (late,),
    ).fetchall()
    assert slots and all(count == 1 for _, _, count in slots)  # landed once
    page.goto(base + "/console/pipeline")
    assert page.locator("button:has-text('Replay')").count() == 0
    assert stack.dead_letters() == 0

    # Forget a person, with the confirmation step.
    page.goto(base + "/console/person?agent=bot&user=grace")
    page.click("text=Forget this person")
    page.click("button:has-text('Forget grace')")
    assert page.locator("text=Forgot grace").count() == 1
    gone = db.execute_sql(
        "SELECT count(*) FROM ibex_memory.memories m JOIN ibex_core.users u ON u.id = m.user_id"
        " WHERE u.external_id = 'grace' AND m.deleted_at IS NULL"
    ).fetchone()[0]
    assert gone == 0

    # No stored script ran on any page.
    assert page.evaluate("window.__xss") is None
    context.close()

    # A token bound to dana sees dana only.
    dana_id = db.execute_sql(
        "SELECT id FROM ibex_core.users WHERE external_id = 'dana'"
    ).fetchone()[0]
    bound = tokens.issue(
        org_id=stack.org_id, name="dana", scopes=ALL, user_id=uuid.UUID(str(dana_id))
    )[1]
    context = chromium.new_context()
    page = context.new_page()
    sign_in(page, base, bound)
    assert page.locator("text=erin").count() == 0
    answer = page.goto(base + "/console/person?agent=bot&user=erin")
    assert answer is not None and answer.status == 404
    unknown = page.goto(base + "/console/person?agent=bot&user=nobody")
    assert unknown is not None and unknown.status == 404
    answer = page.goto(base + f"/console/conversations/{erin}")
    assert answer is not None and answer.status == 404
    assert page.goto(base + "/console/pipeline").status == 403  # type: ignore[union-attr]
    assert page.evaluate("window.__xss") is None
    context.close()
