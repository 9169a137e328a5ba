"""The one dispatch table: the actors are declared from it, and on a worker a message is
validated once (by the shape check), whatever its arguments' form (positional or named)."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import pytest

from core.config import Settings
from core.errors import InvalidMessageError
from extraction import stages
from extraction.dispatch import ROUTES, Route, route_of, run_message
from extraction.stages import Send
from schema.messages import MESSAGE_SCHEMAS, ActorName, Queue
from tests.unit.actors.helpers import drain, stub_worker
from tests.unit.actors.test_actors import ORG, SESSION, FakeDeps, fake_deps


@pytest.fixture
def deps(monkeypatch: pytest.MonkeyPatch) -> FakeDeps:
    settings = Settings.from_env({"MAX_RETRIES": "2", "RETRY_MIN_BACKOFF_MS": "5"})
    return fake_deps(settings, monkeypatch)


def test_the_table_names_every_actor_once_and_every_queue_once() -> None:
    assert set(ROUTES) == set(ActorName) == set(MESSAGE_SCHEMAS)
    assert sorted(route.queue for route in ROUTES.values()) == sorted(Queue)
    for name, route in ROUTES.items():
        assert route.actor == name
        assert isinstance(route.schema, MESSAGE_SCHEMAS[name])


def test_the_actors_are_declared_from_the_table() -> None:
    import actors

    declared = {a.actor_name: a.queue_name for a in actors.ACTORS}
    assert declared == {str(r.actor): str(r.queue) for r in ROUTES.values()}


def test_a_worker_runs_its_fetched_writes_and_pointer_moves_before_its_extractions() -> None:
    """Dramatiq runs a process's fetched messages lowest priority first: a turn whose LLM
    call is done gets its writes and pointer move before another turn's LLM call starts."""
    import actors

    priority = {a.actor_name: a.priority for a in actors.ACTORS}
    assert priority[ActorName.WRITE] == priority[ActorName.POINTER] == 0
    assert priority[ActorName.EXTRACT] > priority[ActorName.WRITE]


def test_an_unknown_actor_is_an_invalid_message() -> None:
    with pytest.raises(InvalidMessageError, match="unknown actor 'nope'"):
        route_of("nope")
    with pytest.raises(InvalidMessageError):
        run_message(None, "nope", {})  # type: ignore[arg-type]


@pytest.mark.parametrize("positional", [True, False])
def test_a_worker_validates_a_message_once(
    positional: bool, deps: FakeDeps, monkeypatch: pytest.MonkeyPatch
) -> None:
    loads: Counter[str] = Counter()
    original = Route.load

    def counting(self: Route, kwargs: Any) -> dict[str, Any]:
        loads[self.actor] += 1
        return original(self, kwargs)

    seen: list[tuple[Any, ...]] = []

    def extract(deps: Any, org_id: Any, session_id: Any, turn_index: Any, **_: Any) -> list[Send]:
        seen.append((org_id, session_id, turn_index))
        return []

    monkeypatch.setattr(Route, "load", counting)
    monkeypatch.setattr(stages, "extract_turn", extract)
    with stub_worker(deps.settings, deps) as stub:
        actor = stub.get_actor(ActorName.EXTRACT)
        if positional:
            actor.send(ORG, SESSION, 4)
        else:
            actor.send_with_options(kwargs={"org_id": ORG, "session_id": SESSION, "turn_index": 4})
        drain(stub)
        assert not stub.dead_letters
    assert loads == Counter({ActorName.EXTRACT: 1})
    # The stage gets the validated values: UUIDs parsed once, by the shape check.
    assert seen == [(uuid.UUID(ORG), uuid.UUID(SESSION), 4)]


def test_an_invalid_message_is_rejected_by_the_shape_check_before_the_actor_runs(
    deps: FakeDeps, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[Any] = []
    monkeypatch.setattr(stages, "write_memory", lambda *a, **k: ran.append(a) or [])
    with stub_worker(deps.settings, deps) as stub:
        stub.get_actor(ActorName.WRITE).send(ORG, SESSION, 1, -1)  # ordinal below 0
        drain(stub)
        [dead] = stub.dead_letters
    assert ran == [] and dead.options.get("retries", 0) == 0
    [record] = deps.mirrored
    assert record.exception_type == "InvalidMessageError"
    assert record.exception_message is not None
    assert record.exception_message.startswith("invalid write_memory message: ordinal")
    # The dead letter's traceback names the schema's complaint, as when the actor raised it.
    assert record.traceback is not None and "InvalidMessageError" in record.traceback


@pytest.mark.parametrize(
    ("kwargs", "complaint"),
    [
        ({"org_id": ORG, "session_id": SESSION}, "missing a required argument: 'turn_index'"),
        (
            {"org_id": ORG, "session_id": SESSION, "turn_index": 1, "ordinal": 0},
            "got an unexpected keyword argument 'ordinal'",
        ),
    ],
)
def test_a_message_whose_names_are_not_the_actors_is_refused_by_its_signature(
    kwargs: dict[str, Any], complaint: str, deps: FakeDeps, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[Any] = []
    monkeypatch.setattr(stages, "extract_turn", lambda *a, **k: ran.append(a) or [])
    with stub_worker(deps.settings, deps) as stub:
        stub.get_actor(ActorName.EXTRACT).send_with_options(kwargs=kwargs)
        drain(stub)
        assert len(stub.dead_letters) == 1
    assert ran == []
    [record] = deps.mirrored
    assert record.exception_type == "InvalidMessageError"
    assert record.exception_message == f"invalid extract_turn message: {complaint}"
