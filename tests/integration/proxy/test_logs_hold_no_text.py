"""No conversation text in any log: a chat turn that is dead-lettered and one that is retried,
through the proxy and a real worker process (the Procfile's ``worker`` line, its output in a
log file), leave their ids in the logs and none of their words.

- The dead-lettered turn: the proxy records a call into a session the application deleted
  meanwhile; the worker refuses it for good (``RecordRefused``): a dead letter.
- The retried turn: a call that continues a conversation whose earlier turn the session does
  not hold yet (``EarlierTurnPending``, an expected wait): retried, then stored.

Both carry marker words in the user's messages, the assistant's answers and the injected
memory; the worker's log file and this process's log records (the proxy runs here) must hold
none of them. The worker's log says which message failed or waits, by actor and id.
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.stack.processes import ROOT, Launcher
from tests.integration.proxy.conftest import Org, ProxyServer, wait_for

pytestmark = [pytest.mark.slow]

BIN = Path(sys.executable).parent
SECRET_SAID = "my-secret-diagnosis-zorblax"
SECRET_ANSWER = "answered-about-quintessa"
SECRET_MEMORY = "The user keeps a diary named Wobbelkopf."
MARKERS = ("zorblax", "quintessa", "Wobbelkopf")


def _worker_env(database_url: str, redis_url: str) -> dict[str, str]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "IBEX_"))},
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "MEMORY_SERVICE_URL": "http://127.0.0.1:9",
        "MEMORY_SERVICE_TOKEN": "unused",
        "WORKER_PROCESSES": "1",
        "WORKER_THREADS": "2",
        "MAX_RETRIES": "5",
        "RETRY_MIN_BACKOFF_MS": "100",
        "RETRY_MAX_BACKOFF_MS": "300",
        "EMBEDDINGS_PROVIDER": "none",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    return env


def test_a_dead_lettered_and_a_retried_chat_turn_leave_no_text_in_any_log(
    proxy_server: ProxyServer,
    store: Any,
    db: Any,
    acme: Org,
    database_url: str,
    redis_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)  # the level the processes log at
    agent_id = store.ensure_agent(acme.org_id, "bot")
    # A memory the injection puts into the call (so the spooled turn holds it too).
    with db.atomic():
        db.execute_sql("SELECT set_config('ibex.org_id', %s, true)", (str(acme.org_id),))
        db.execute_sql(
            "INSERT INTO ibex_memory.memories (org_id, agent_id, content, content_hash, kind)"
            " VALUES (%s, %s, %s, md5(%s), 'fact')",
            (str(acme.org_id), str(agent_id), SECRET_MEMORY, SECRET_MEMORY),
        )
    deleted = store.create_session(acme.org_id, agent_id, "deleted-conv")
    store.soft_delete_session(acme.org_id, deleted.id)
    headers = {
        "Authorization": "Bearer sk-callers-own",
        "X-IBEX-Token": acme.token,
        "X-IBEX-Agent": "bot",
        "X-IBEX-Memory": "inject",
    }
    said = [{"role": "user", "content": f"I need help with {SECRET_SAID}; keep a diary?"}]
    continued = [
        {"role": "user", "content": f"Earlier: {SECRET_SAID}."},
        {"role": "assistant", "content": f"I {SECRET_ANSWER}."},
        {"role": "user", "content": f"And now, about {SECRET_SAID}?"},
    ]
    for session, messages in (("deleted-conv", said), ("waiting-conv", continued)):
        answer = httpx.post(
            f"{proxy_server.url}/v1/chat/completions",
            json={"model": "fake", "messages": messages},
            headers={**headers, "X-IBEX-Session-ID": session},
            timeout=10,
        )
        assert answer.status_code == 200, answer.text
    proxy_server.settle()

    log = tmp_path / "worker.log"
    with Launcher(tmp_path, cwd=ROOT) as launcher:
        launcher.start_procfile("worker", _worker_env(database_url, redis_url), log=log)
        wait_for(
            lambda: (
                db.execute_sql(
                    "SELECT count(*) FROM ibex_core.dead_letters"
                    " WHERE actor_name = 'record_chat_turn'"
                ).fetchone()[0]
                == 1
            ),
            "the dead letter",
            60,
        )
        wait_for(
            lambda: (
                store.find_session(acme.org_id, agent_id, "waiting-conv") is not None
                and store.find_session(acme.org_id, agent_id, "waiting-conv").turn_count == 1
            ),
            "the retried turn stored",
            60,
        )
    text = log.read_text(errors="replace")
    (message_id,) = db.execute_sql(
        "SELECT message_id FROM ibex_core.dead_letters WHERE actor_name = 'record_chat_turn'"
    ).fetchone()
    # The dead letter is logged by actor, id and the ids it carries, and why (by class).
    assert f"dead letter: record_chat_turn {message_id}" in text, text
    assert "external_id='deleted-conv'" in text and "RecordRefused" in text, text
    # The expected wait: one WARNING line, no traceback.
    assert "will be retried: EarlierTurnPending" in text, text
    assert "Traceback" not in text, text
    logged_here = "\n".join(r.getMessage() for r in caplog.records)
    for marker in MARKERS:
        assert marker not in text, f"{marker!r} in the worker's log:\n{text}"
        assert marker not in logged_here, f"{marker!r} in this process's log"
    # The text is where an operator reads it on purpose: the dead letter's payload.
    (payload,) = db.execute_sql(
        "SELECT payload::text FROM ibex_core.dead_letters WHERE message_id = %s", (message_id,)
    ).fetchone()
    assert "zorblax" in payload
    uuid.UUID(str(message_id))
