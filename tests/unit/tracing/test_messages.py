"""The trace context through the queue: real actors on a StubBroker with fake stages.

One scan sending two turns makes two traces, one per turn, each holding its ``scan turn``
root, the extraction (both attempts, when the first fails), the writes and the pointer; a
dead-letter replay carries the context of the first delivery.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from typing import Any

import dramatiq
import pytest

from actors.tracing import TraceMessages
from core import tracing
from core.config import Settings
from core.errors import MemoryUnavailableError
from extraction import stages
from extraction.deadletters import fresh_payload
from extraction.envelope import message_problem
from extraction.stages import ScanReport, Send
from tests.unit.actors.helpers import drain, stub_worker
from tests.unit.actors.test_actors import fake_deps
from tests.unit.tracing.helpers import by_name, recorded_spans

ORG, SESSION = str(uuid.uuid4()), str(uuid.uuid4())


@pytest.fixture
def settings() -> Settings:
    return Settings.from_env(
        {"MAX_RETRIES": "2", "RETRY_MIN_BACKOFF_MS": "5", "RETRY_MAX_BACKOFF_MS": "20"}
    )


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> Any:
    # The variable puts TraceMessages in the broker's middleware; the spans go to memory.
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    with recorded_spans() as exporter:
        yield exporter


def _ids(turn_index: int) -> dict[str, Any]:
    return {"org_id": ORG, "session_id": SESSION, "turn_index": turn_index}


def test_each_turn_the_scan_sends_is_one_trace_through_every_stage_and_a_retry(
    settings: Settings, traced: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: Counter[str] = Counter()
    lock = threading.Lock()

    def hit(name: str) -> int:
        with lock:
            calls[name] += 1
            return calls[name]

    def scan(deps: Any, *, session_id: Any = None) -> ScanReport:
        report = ScanReport()
        report.sent.extend(Send("extract_turn", _ids(t)) for t in (1, 2))
        return report

    def extract(d: Any, org_id: Any, session_id: Any, turn_index: int, **_: Any) -> list[Send]:
        if turn_index == 2 and hit("extract 2") == 1:
            raise MemoryUnavailableError("blip")  # one forced retry, with backoff
        return [Send("write_memory", {**_ids(turn_index), "ordinal": o}) for o in range(2)]

    def write(d: Any, org_id: Any, session_id: Any, turn_index: int, ordinal: int) -> list[Send]:
        return [Send("advance_pointer", _ids(turn_index))] if ordinal == 1 else []

    monkeypatch.setattr(stages, "scan", scan)
    monkeypatch.setattr(stages, "extract_turn", extract)
    monkeypatch.setattr(stages, "write_memory", write)
    monkeypatch.setattr(stages, "complete_turn", lambda *a, **k: [])
    with stub_worker(settings, fake_deps(settings, monkeypatch)) as stub:
        assert any(isinstance(m, TraceMessages) for m in stub.middleware)
        stub.get_actor("scan_sessions").send()
        drain(stub)
        assert stub.dead_letters == []
    spans = traced.get_finished_spans()

    [sent] = by_name(spans, "scan_sessions send")
    [scan_span] = by_name(spans, "scan_sessions process")
    assert sent.parent is None and scan_span.parent.span_id == sent.context.span_id
    assert scan_span.context.trace_id == sent.context.trace_id
    roots = by_name(spans, "scan turn")
    assert len(roots) == 2
    traces = set()
    for root in roots:
        assert root.parent is None  # a trace of its own per turn ...
        assert [link.context.span_id for link in root.links] == [scan_span.context.span_id]
        turn = root.attributes["ibex.turn_index"]
        trace_id = root.context.trace_id
        traces.add(trace_id)
        mine = [s for s in spans if s.context.trace_id == trace_id]
        names = Counter(s.name for s in mine)
        attempts = 2 if turn == 2 else 1
        assert names == Counter(
            {
                "scan turn": 1,
                "extract_turn process": attempts,
                "write_memory process": 2,
                "advance_pointer process": 1,
            }
        )
        extracts = by_name(mine, "extract_turn process")
        # ... and every attempt of its extraction is a child of that root.
        assert {s.parent.span_id for s in extracts} == {root.context.span_id}
        assert sorted(s.attributes["ibex.retries"] for s in extracts) == list(range(attempts))
        for s in mine:
            if s.name.endswith("process"):
                assert s.attributes["ibex.org_id"] == ORG
                assert s.attributes["ibex.session_id"] == SESSION
                assert s.attributes["ibex.turn_index"] == turn
                assert s.attributes["messaging.system"] == "dramatiq"
                assert s.attributes["messaging.message.id"]
                assert s.attributes["messaging.destination.name"] in {
                    "extract",
                    "write",
                    "pointer",
                }
        writes = by_name(mine, "write_memory process")
        assert sorted(s.attributes["ibex.ordinal"] for s in writes) == [0, 1]
        if turn == 2:
            failed = [s for s in extracts if s.attributes["ibex.retries"] == 0]
            assert failed[0].attributes["error.type"] == "MemoryUnavailableError"
            assert "blip" not in (failed[0].status.description or "")
    assert len(traces) == 2 and sent.context.trace_id not in traces


def test_a_message_sent_inside_a_span_carries_it_and_a_replay_keeps_it(
    settings: Settings, traced: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[dict[str, Any]] = []

    def pointer(*args: Any, **kwargs: Any) -> list[Send]:
        from dramatiq.middleware import CurrentMessage

        message = CurrentMessage.get_current_message()
        assert message is not None
        seen.append(dict(message.options))
        return []

    monkeypatch.setattr(stages, "complete_turn", pointer)
    with stub_worker(settings, fake_deps(settings, monkeypatch)) as stub:
        with tracing.span("a web request", kind="server") as outer:
            sent = stub.get_actor("advance_pointer").send(ORG, SESSION, 3)
        drain(stub)
        # The dead-letter replay enqueues the stored payload anew: its options keep the context.
        replayed = fresh_payload(json.loads(sent.encode()), "new-redis-id", 0)
        assert message_problem(replayed) is None
        assert replayed["options"]["traceparent"] == sent.options["traceparent"]
        stub.enqueue(dramatiq.Message.decode(json.dumps(replayed).encode()))
        drain(stub)
    ours = f"{outer.get_span_context().trace_id:032x}"
    assert [o["traceparent"].split("-")[1] for o in seen] == [ours, ours]
    processed = by_name(traced.get_finished_spans(), "advance_pointer process")
    assert len(processed) == 2
    assert {s.parent.span_id for s in processed} == {outer.get_span_context().span_id}


def test_the_envelope_check_refuses_a_trace_context_that_is_not_text() -> None:
    message = {
        "queue_name": "pointer",
        "actor_name": "advance_pointer",
        "message_id": "m",
        "message_timestamp": 0,
        "args": [],
        "kwargs": _ids(1),
        "options": {"traceparent": 7},
    }
    assert message_problem(message) == "option traceparent is a int"
    message["options"] = {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"}
    assert message_problem(message) is None


def test_a_malformed_traceparent_starts_a_fresh_trace(
    settings: Settings, traced: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stages, "complete_turn", lambda *a, **k: [])
    with stub_worker(settings, fake_deps(settings, monkeypatch)) as stub:
        stub.get_actor("advance_pointer").send_with_options(
            kwargs=_ids(1), traceparent="not a trace context"
        )
        drain(stub)
        assert stub.dead_letters == []
    [processed] = by_name(traced.get_finished_spans(), "advance_pointer process")
    assert processed.parent is None
