"""The actor shells on a StubBroker + Worker with fake stages: no sockets, no database.

What is checked here is the queue behaviour: invalid payloads and permanent errors go to the
dead-letter queue at once (and to the mirror), transient errors retry with backoff, a busy turn
waits without using up retries, and follow-up messages are sent to the right actors.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest

from core.config import Settings
from core.errors import (
    DatabaseUnavailableError,
    InvalidMessageError,
    MemoryRejectedError,
    MemoryUnavailableError,
    TurnBusyError,
)
from extraction import deadletter_rows, stages
from extraction.deadletter_rows import DeadLetterRecord
from extraction.stages import Send
from extraction.values import TurnRef
from tests.unit.actors.helpers import drain, stub_worker

ORG, SESSION = str(uuid.uuid4()), str(uuid.uuid4())


class FakeDB:
    """Counts connections; like peewee, the connection state is per thread."""

    def __init__(self) -> None:
        self.connects = 0
        self.closes = 0
        self._local = threading.local()
        self._lock = threading.Lock()

    def connect(self, reuse_if_open: bool = False) -> None:
        with self._lock:
            self.connects += 1
        self._local.open = True

    def is_closed(self) -> bool:
        return not getattr(self._local, "open", False)

    def in_transaction(self) -> bool:
        return False

    def atomic(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def close(self) -> None:
        with self._lock:
            self.closes += 1
        self._local.open = False


@dataclass
class FakeTurns:
    failed: list[tuple[TurnRef, str]] = field(default_factory=list)

    def mark_failed(self, ref: TurnRef, error: str) -> bool:
        self.failed.append((ref, error))
        return True


@dataclass
class FakeStore:
    db: FakeDB = field(default_factory=FakeDB)


@dataclass
class FakeDeps:
    settings: Settings
    store: FakeStore = field(default_factory=FakeStore)
    turns: FakeTurns = field(default_factory=FakeTurns)
    #: What the dead-letter mirror was given (see the ``deps`` fixture).
    mirrored: list[DeadLetterRecord] = field(default_factory=list)


@pytest.fixture
def settings() -> Settings:
    return Settings.from_env(
        {
            "MAX_RETRIES": "2",
            "RETRY_MIN_BACKOFF_MS": "5",
            "RETRY_MAX_BACKOFF_MS": "20",
            "EXTRACTION_CLAIM_SECONDS": "1",
        }
    )


def fake_deps(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> FakeDeps:
    """Fake deps whose ``mirrored`` receives what the worker gives the dead-letter mirror."""
    fake = FakeDeps(settings)
    monkeypatch.setattr(deadletter_rows, "mirror", lambda db, record: fake.mirrored.append(record))
    return fake


@pytest.fixture
def deps(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> FakeDeps:
    return fake_deps(settings, monkeypatch)


class Calls:
    def __init__(self) -> None:
        self.counter: Counter[str] = Counter()
        self.lock = threading.Lock()

    def hit(self, name: str) -> int:
        with self.lock:
            self.counter[name] += 1
            return self.counter[name]


def turn(turn_index: int = 1) -> dict[str, Any]:
    return {"org_id": ORG, "session_id": SESSION, "turn_index": turn_index}


@pytest.mark.parametrize(
    ("actor", "kwargs"),
    [
        ("extract_turn", {**turn(), "org_id": "not-a-uuid"}),
        ("extract_turn", {**turn(), "turn_index": 0}),
        ("extract_turn", {**turn(), "turn_index": True}),
        ("extract_turn", {"org_id": ORG, "session_id": SESSION}),  # missing turn_index
        ("write_memory", {**turn(), "ordinal": -1}),
        ("write_memory", {**turn(), "ordinal": 0, "surprise": 1}),  # unknown argument
        ("advance_pointer", {**turn(), "turn_index": "3"}),
        ("scan_sessions", {"session_id": "nope"}),
    ],
)
def test_an_invalid_message_is_dead_lettered_at_once_and_mirrored(
    actor: str, kwargs: dict[str, Any], settings: Settings, deps: FakeDeps, monkeypatch: Any
) -> None:
    calls = Calls()
    for name in ("scan", "extract_turn", "write_memory", "complete_turn"):
        monkeypatch.setattr(stages, name, lambda *a, _n=name, **k: calls.hit(_n) and [])
    with stub_worker(settings, deps) as stub:
        stub.get_actor(actor).send_with_options(kwargs=kwargs)
        drain(stub)
        [dead] = stub.dead_letters
    assert sum(calls.counter.values()) == 0  # the stage never ran
    assert dead.options.get("retries", 0) == 0  # not retried
    [record] = deps.mirrored
    assert record.actor_name == actor
    assert record.exception_type == "InvalidMessageError"
    assert record.exception_message and "invalid" in record.exception_message
    assert record.payload["kwargs"] == kwargs


def test_a_permanent_error_dead_letters_without_retrying_and_fails_the_turn(
    settings: Settings, deps: FakeDeps, monkeypatch: Any
) -> None:
    calls = Calls()

    def rejected(*args: Any, **kwargs: Any) -> list[Send]:
        calls.hit("write")
        raise MemoryRejectedError("422 VALIDATION: content too long", status=422)

    monkeypatch.setattr(stages, "write_memory", rejected)
    with stub_worker(settings, deps) as stub:
        stub.get_actor("write_memory").send(ORG, SESSION, 3, 1)
        drain(stub)
        assert len(stub.dead_letters) == 1
    assert calls.counter["write"] == 1
    [record] = deps.mirrored
    assert (record.exception_type, record.turn_index, record.ordinal) == (
        "MemoryRejectedError",
        3,
        1,
    )
    assert record.org_id == uuid.UUID(ORG) and record.session_id == uuid.UUID(SESSION)
    assert record.queue_name == "write" and record.attempts == 1
    assert record.exception_message and "content too long" in record.exception_message
    [(ref, error)] = deps.turns.failed
    assert ref == TurnRef.of(ORG, SESSION, 3) and "MemoryRejectedError" in error


def test_a_transient_error_retries_with_backoff_then_dead_letters_when_exhausted(
    settings: Settings, deps: FakeDeps, monkeypatch: Any
) -> None:
    calls = Calls()

    def unavailable(*args: Any, **kwargs: Any) -> list[Send]:
        calls.hit("write")
        raise MemoryUnavailableError("503 from the memory service", status=503)

    monkeypatch.setattr(stages, "write_memory", unavailable)
    with stub_worker(settings, deps) as stub:
        stub.get_actor("write_memory").send(ORG, SESSION, 1, 0)
        drain(stub)
        [dead] = stub.dead_letters
    assert calls.counter["write"] == settings.max_retries + 1
    assert dead.options["retries"] == settings.max_retries + 1
    [record] = deps.mirrored
    assert record.exception_type == "MemoryUnavailableError"
    assert record.traceback and "MemoryUnavailableError" in record.traceback


def test_a_transient_error_then_success_sends_the_follow_ups(
    settings: Settings, deps: FakeDeps, monkeypatch: Any
) -> None:
    calls = Calls()

    def flaky_extract(
        d: Any, org_id: Any, session_id: Any, turn_index: int, **_: Any
    ) -> list[Send]:
        if calls.hit("extract") == 1:
            raise MemoryUnavailableError("blip", retry_after=0.01)
        base = {"org_id": str(org_id), "session_id": str(session_id), "turn_index": turn_index}
        return [Send("write_memory", {**base, "ordinal": o}) for o in range(3)]

    def write(d: Any, org_id: Any, session_id: Any, turn_index: int, ordinal: int) -> list[Send]:
        n = calls.hit("write")
        base = {"org_id": str(org_id), "session_id": str(session_id), "turn_index": turn_index}
        return [Send("advance_pointer", base)] if n == 3 else []

    monkeypatch.setattr(stages, "extract_turn", flaky_extract)
    monkeypatch.setattr(stages, "write_memory", write)
    monkeypatch.setattr(stages, "complete_turn", lambda *a, **k: calls.hit("pointer") and [])
    with stub_worker(settings, deps) as stub:
        stub.get_actor("extract_turn").send(ORG, SESSION, 2)
        drain(stub)
        assert stub.dead_letters == []
    assert calls.counter == Counter({"extract": 2, "write": 3, "pointer": 1})
    assert deps.mirrored == []
    # One connection per message, always given back.
    assert deps.store.db.connects == 6 and deps.store.db.closes == 6


def test_a_claim_left_by_a_failed_attempt_is_carried_into_that_messages_retry_only(
    settings: Settings, deps: FakeDeps, monkeypatch: Any
) -> None:
    # Crash point: the database became unavailable after the LLM answered, so the attempt could
    # neither persist the answer nor release its claim, and says so on its Delivery.
    abandoned = uuid.uuid4()
    seen: list[tuple[str | None, uuid.UUID | None]] = []

    def extract(*args: Any, delivery: stages.Delivery, **kwargs: Any) -> list[Send]:
        seen.append((delivery.message_id, delivery.abandoned_claim))
        if len(seen) == 1:
            delivery.abandoned_claim = abandoned
            raise DatabaseUnavailableError("server closed the connection")
        return []

    monkeypatch.setattr(stages, "extract_turn", extract)
    with stub_worker(settings, deps) as stub:
        first = stub.get_actor("extract_turn").send(ORG, SESSION, 1)
        other = stub.get_actor("extract_turn").send(ORG, SESSION, 1)
        drain(stub)
        assert stub.dead_letters == []
    by_message: dict[str | None, list[uuid.UUID | None]] = {}
    for message_id, claim in seen:
        by_message.setdefault(message_id, []).append(claim)
    # The failed message's retry (same id) carries the claim; the other message never does.
    assert by_message[first.message_id] == [None, abandoned]
    assert by_message[other.message_id] == [None]


def test_a_busy_turn_waits_without_using_up_its_retries(
    settings: Settings, deps: FakeDeps, monkeypatch: Any
) -> None:
    calls = Calls()

    def busy_then_done(*args: Any, **kwargs: Any) -> list[Send]:
        if calls.hit("extract") <= settings.max_retries + 3:
            raise TurnBusyError("claimed elsewhere", retry_after=0.001)
        return []

    monkeypatch.setattr(stages, "extract_turn", busy_then_done)
    with stub_worker(settings, deps) as stub:
        stub.get_actor("extract_turn").send(ORG, SESSION, 1)
        drain(stub)
        assert stub.dead_letters == []
    assert calls.counter["extract"] == settings.max_retries + 4


def test_the_scan_actor_sends_one_extract_turn_per_leased_turn(
    settings: Settings, deps: FakeDeps, monkeypatch: Any
) -> None:
    calls = Calls()
    report = stages.ScanReport(sessions=1, sent=[Send("extract_turn", turn(i)) for i in (1, 2, 3)])
    monkeypatch.setattr(stages, "scan", lambda d, session_id=None: report)
    monkeypatch.setattr(stages, "extract_turn", lambda *a, **k: calls.hit("extract") and [])
    with stub_worker(settings, deps) as stub:
        stub.get_actor("scan_sessions").send()
        drain(stub)
    assert calls.counter["extract"] == 3


def test_a_message_for_an_unknown_actor_is_dead_lettered_and_mirrored(
    settings: Settings, deps: FakeDeps
) -> None:
    import dramatiq

    with stub_worker(settings, deps) as stub:
        message = dramatiq.Message(
            queue_name="extract", actor_name="extract_turns", args=(), kwargs=turn(), options={}
        )
        stub.enqueue(message)
        drain(stub)
        assert len(stub.dead_letters) == 1
    [record] = deps.mirrored
    assert record.actor_name == "extract_turns" and record.exception_type == "ActorNotFound"
    assert deps.turns.failed == []  # not a pipeline actor: no turn to fail


def test_invalid_message_error_is_permanent() -> None:
    from core.errors import PermanentError

    assert issubclass(InvalidMessageError, PermanentError)
