"""One turn's trace across real processes: the Procfile's ``web``, ``worker`` and
``scheduler`` lines with ``OTEL_EXPORTER_OTLP_ENDPOINT`` set, exporting over OTLP/HTTP to a
receiver this test runs. The fake LLM fails the turn's first call, so the extraction is
retried; its spans (the scan's root span for the turn, both extraction attempts, both LLM
calls, the writes, the memory POSTs on both sides and the pointer) share one trace id, and the
scan that sent it leads back to the scheduler. No span holds a word of the conversation.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from bench.fake_llm import FakeLLM
from cli.stack.processes import ROOT, Launcher, free_port
from memories.tokens import TokenStore
from tests.integration.procfile_env import procfile_env

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
#: The conversation's distinctive word: in the memories, never in a span.
WORD = "Xylocarpine"
MEMORIES = 2


class Receiver:
    """An OTLP/HTTP trace receiver: every span received, flattened, with its service."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.take(body)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        found = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(
                        {
                            "service": resource.get("service.name"),
                            "name": span.name,
                            "trace": span.trace_id.hex(),
                            "id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex() or None,
                            "kind": span.kind,
                            "attributes": {a.key: _value(a.value) for a in span.attributes},
                            "links": [link.span_id.hex() for link in span.links],
                            "status": span.status.message,
                            "events": [str(e) for e in span.events],
                        }
                    )
        with self.lock:
            self.spans.extend(found)

    def snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.spans)


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    found.thread.start()
    try:
        yield found
    finally:
        found.server.shutdown()
        found.server.server_close()


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM(memories=MEMORIES, model="fake-llm") as fake:
        yield fake


@pytest.fixture
def env(
    db: Any, database_url: str, redis_url: str, receiver: Receiver, llm: FakeLLM
) -> dict[str, str]:
    _, service = TokenStore(db).issue(org_id=None, name="pipeline", scopes=["memory:write"])
    return procfile_env(
        database_url,
        redis_url,
        free_port(),
        token=service,
        SCAN_INTERVAL_SECONDS="1",
        RETRY_MIN_BACKOFF_MS="50",
        RETRY_MAX_BACKOFF_MS="200",
        LLM_PROVIDER="openai",
        LLM_BASE_URL=llm.base_url,
        LLM_MODEL="fake-llm",
        LLM_TIMEOUT_SECONDS="5",
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
        OTEL_BSP_SCHEDULE_DELAY="100",
    )


def _import_one_turn(env: dict[str, str], path: Path) -> None:
    line = {
        "org": "acme",
        "agent": "bot",
        "session": "traced",
        "turns": [
            {
                "messages": [{"role": "user", "content": f"My cat is named {WORD}."}],
                "completion": {"role": "assistant", "content": f"{WORD} is a fine name."},
            }
        ],
    }
    path.write_text(json.dumps(line) + "\n")
    done = subprocess.run(
        [str(BIN / "ibex"), "import", str(path)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def _wait(what: str, check: Any, launcher: Launcher, timeout: float = 40) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            logs = "".join(p.log_tail(2000) for p in launcher)
            raise AssertionError(f"waited for {what}: {logs}")
        time.sleep(0.2)


def test_one_turns_spans_share_one_trace_across_processes_and_a_retry(
    env: dict[str, str], receiver: Receiver, llm: FakeLLM, db: Any, tmp_path: Path
) -> None:
    llm.fail_next(1, status=500)  # the turn's first LLM call fails: its message is retried
    _import_one_turn(env, tmp_path / "turn.jsonl")
    with Launcher(tmp_path, cwd=ROOT) as launcher:
        launcher.start_procfile("web", env, bind_host="127.0.0.1")
        launcher.wait_http(f"{env['MEMORY_SERVICE_URL']}/readyz", timeout=30)
        launcher.start_procfile("worker", env)
        launcher.start_procfile("scheduler", env)

        def done() -> bool:
            row = db.execute_sql(
                "SELECT state::text FROM ibex_core.extraction_turns WHERE turn_index = 1"
            ).fetchone()
            return row is not None and row[0] == "done"

        _wait("the turn to be done", done, launcher)

        def turn_trace() -> list[dict[str, Any]] | None:
            spans = receiver.snapshot()
            roots = [s for s in spans if s["name"] == "scan turn"]
            if not roots:
                return None
            mine = [s for s in spans if s["trace"] == roots[0]["trace"]]
            names = [s["name"] for s in mine]
            ready = names.count("POST /v1/memories") == 2 * MEMORIES
            return mine if ready and "advance_pointer process" in names else None

        trace = _wait("the turn's spans", turn_trace, launcher)
        time.sleep(0.5)  # a late batch (the scheduler's) may still be on its way
        spans = receiver.snapshot()

    trace_id = trace[0]["trace"]
    trace = [s for s in spans if s["trace"] == trace_id]
    by_name: dict[str, list[dict[str, Any]]] = {}
    for span in trace:
        by_name.setdefault(span["name"], []).append(span)

    [root] = by_name["scan turn"]
    assert root["parent"] is None and root["service"] == "ibex-worker"
    # The retry joins: both extraction attempts are children of the turn's root.
    extracts = by_name["extract_turn process"]
    assert sorted(s["attributes"]["ibex.retries"] for s in extracts) == [0, 1]
    assert {s["parent"] for s in extracts} == {root["id"]}
    failed_llm, answered_llm = sorted(
        by_name["chat fake-llm"], key=lambda s: "error.type" not in s["attributes"]
    )
    assert failed_llm["attributes"]["error.type"] == "LLMUnavailableError"
    assert answered_llm["attributes"]["gen_ai.operation.name"] == "chat"
    assert answered_llm["attributes"]["gen_ai.request.model"] == "fake-llm"
    assert answered_llm["attributes"]["gen_ai.usage.input_tokens"] > 0
    assert answered_llm["attributes"]["gen_ai.usage.output_tokens"] > 0
    assert {s["parent"] for s in by_name["chat fake-llm"]} == {s["id"] for s in extracts}
    assert len(by_name["write_memory process"]) == MEMORIES
    [pointer] = by_name["advance_pointer process"]
    assert pointer["attributes"]["ibex.turn_index"] == 1
    # The memory POST on both sides: the web's server span is the worker's client span's child.
    posts = by_name["POST /v1/memories"]
    clients = {s["id"]: s for s in posts if s["service"] == "ibex-worker"}
    servers = [s for s in posts if s["service"] == "ibex-web"]
    assert len(clients) == len(servers) == MEMORIES
    assert {s["parent"] for s in servers} == set(clients)
    assert all(s["attributes"]["http.response.status_code"] == 201 for s in servers)
    assert all(s["attributes"]["http.route"] == "/v1/memories" for s in servers)
    assert {s["service"] for s in trace} == {"ibex-worker", "ibex-web"}

    # The scan that sent the turn: linked from the root, in a trace the scheduler started.
    [scan] = [s for s in spans if s["id"] in root["links"]]
    assert scan["name"] == "scan_sessions process"
    scheduler = [s for s in spans if s["trace"] == scan["trace"] and s["id"] == scan["parent"]]
    assert [(s["service"], s["name"]) for s in scheduler] == [
        ("ibex-scheduler", "scan_sessions send")
    ]

    # The memories hold the word; no span does.
    stored = db.execute_sql("SELECT content FROM ibex_memory.memories").fetchall()
    assert len(stored) == MEMORIES and all(WORD in c for (c,) in stored)
    assert not [s for s in spans if WORD in json.dumps(s)]
