"""Poison messages on real Redis: a message the worker cannot run becomes a dead letter, the
messages fetched with it run, and ``ibex dlq`` / ``ibex status`` show it whatever it holds.

The payloads are pushed into the queue's Redis keys by hand, exactly where Dramatiq's enqueue
puts them (``<ns>:<queue>`` and ``<ns>:<queue>.msgs``), ahead of and between valid messages;
then a real Worker runs the real actors on the real broker. Without the consumer guard the
first malformed payload raises out of Dramatiq's consumer, the rest of its batch stays in the
worker's in-flight set, and the valid turns never finish.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import dramatiq
import pytest
import redis

from extraction.deadletters import DeadLetterStore
from extraction.envelope import MALFORMED
from extraction.stages import StageDeps, scan
from tests.integration.operations.test_dlq import _cli, redis_worker, wait_for
from tests.integration.pipeline.helpers import (
    FakeMemoryService,
    FakeProvider,
    assert_complete,
    dead_letter_rows,
    make_session,
    pipeline_settings,
)

NS = "dramatiq"


def _envelope(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "queue_name": "extract",
        "actor_name": "extract_turn",
        "message_id": str(uuid.uuid4()),
        "message_timestamp": 1,
        "args": [],
        "kwargs": {},
        "options": {},
    }
    fields.update(overrides)
    return {k: v for k, v in fields.items() if v is not _DROP}


_DROP = object()

#: (name, raw payload) of every kind of message the worker cannot run.
MALFORMED_PAYLOADS: list[tuple[str, bytes]] = [
    ("invalid JSON", b"{not json"),
    ("not UTF-8", b"\xff\xfe\x00garbage"),
    ("a JSON array", b"[1, 2, 3]"),
    ("no message_id", json.dumps(_envelope(message_id=_DROP)).encode()),
    ("no actor_name", json.dumps(_envelope(actor_name=_DROP)).encode()),
    ("args a string", json.dumps(_envelope(args="abc")).encode()),
    ("options a string", json.dumps(_envelope(options="fast")).encode()),
    ("retries not a number", json.dumps(_envelope(options={"retries": "many"})).encode()),
    ("another queue's name", json.dumps(_envelope(queue_name="write")).encode()),
    ("an unknown field", json.dumps({**_envelope(), "priority": 3}).encode()),
]
#: Envelopes that decode but name no actor, or whose arguments do not bind: the worker's own
#: failure path dead-letters them.
UNRUNNABLE_PAYLOADS: list[tuple[str, bytes]] = [
    ("unknown actor", json.dumps(_envelope(actor_name="no_such_actor")).encode()),
    ("arguments that do not bind", json.dumps(_envelope(kwargs={"bogus": 1})).encode()),
]


def push_raw(client: redis.Redis, queue: str, payloads: list[bytes]) -> list[str]:
    """Append ``payloads`` to ``queue`` as Dramatiq's enqueue does; returns their ids."""
    ids = []
    for payload in payloads:
        redis_id = str(uuid.uuid4())
        client.hset(f"{NS}:{queue}.msgs", redis_id, payload)
        client.rpush(f"{NS}:{queue}", redis_id)
        ids.append(redis_id)
    return ids


def valid_payload(kwargs: dict[str, Any]) -> bytes:
    message: dramatiq.Message[Any] = dramatiq.Message(
        queue_name="extract", actor_name="extract_turn", args=(), kwargs=kwargs, options={}
    )
    return message.encode()


@pytest.fixture
def env(database_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("REDIS_URL", redis_url)


def test_malformed_messages_are_dead_lettered_and_never_strand_their_batch(
    store: Any, db: Any, database_url: str, redis_url: str, env: None, capsys: Any
) -> None:
    settings = pipeline_settings(database_url, redis_url)
    memory = FakeMemoryService()
    deps = StageDeps(
        store=store, settings=settings, provider=FakeProvider(memories=2), memory=memory
    )
    sessions = [make_session(store, 3), make_session(store, 2, agent="other")]
    sent = scan(deps).sent  # leases every turn: the valid extract_turn messages
    assert len(sent) == 5
    client = redis.Redis.from_url(redis_url)
    bad = [raw for _, raw in MALFORMED_PAYLOADS + UNRUNNABLE_PAYLOADS]
    # Poison first, then valid and poison interleaved: all within the first fetched batches.
    queue_order = (
        bad[:3]
        + [
            raw
            for pair in zip([valid_payload(s.kwargs) for s in sent], bad[3:], strict=False)
            for raw in pair
        ]
        + bad[3 + len(sent) :]
    )
    push_raw(client, "extract", queue_order)

    with redis_worker(deps, redis_url) as broker:
        # Far sooner than any heartbeat requeue (30 s) or lease expiry (the scan's backstop).
        wait_for(
            lambda: all(
                db.execute_sql(
                    "SELECT last_extracted_turn FROM ibex_core.sessions WHERE id = %s",
                    (str(ref.session_id),),
                ).fetchone()[0]
                == ref.turns
                for ref in sessions
            ),
            "every valid turn to finish",
            timeout=15,
        )
        wait_for(lambda: client.zcard(f"{NS}:extract.XQ") == len(bad), "the dead letters")
        wait_for(lambda: len(dead_letter_rows(db)) == len(bad), "the mirror")
        in_flight = client.scard(f"{NS}:__acks__.{broker.broker_id}.extract")
    assert_complete(db, memory, sessions)
    assert in_flight == 0, "a message was left unacked in the worker's in-flight set"
    assert client.llen(f"{NS}:extract") == 0 and client.hlen(f"{NS}:extract.msgs") == 0

    rows = dead_letter_rows(db)
    malformed = [r for r in rows if r["exception_type"] == MALFORMED]
    assert len(malformed) == len(MALFORMED_PAYLOADS)
    reasons = " | ".join(r["exception_message"] for r in malformed)
    for needle in (
        "not valid JSON",
        "JSON list",
        "no message_id",
        "no actor_name",
        "args is a str",
        "options is a str",
        "option retries is a str",
        "not the queue it was sent to",
        "unexpected field 'priority'",
    ):
        assert needle in reasons, (needle, reasons)
    assert {"raw": "{not json"} in [r["payload"] for r in malformed]
    others = {r["exception_type"] for r in rows if r["exception_type"] != MALFORMED}
    assert others == {"ActorNotFound", "InvalidMessageError"}

    code, out, _ = _cli(capsys, "dlq", "list", "--json")
    assert code == 0
    letters = json.loads(out)
    assert len(letters) == len(bad)
    assert sum(1 for letter in letters if letter["malformed"]) == len(MALFORMED_PAYLOADS)
    assert all(letter["in_redis"] and letter["in_mirror"] for letter in letters)
    code, out, _ = _cli(capsys, "dlq", "list")
    assert code == 0 and out.count("MALFORMED (cannot be replayed)") == len(MALFORMED_PAYLOADS)
    garbage = next(
        letter
        for letter in letters
        if (letter["malformed"] or "").startswith("not valid JSON: Expecting")
    )
    code, out, _ = _cli(capsys, "dlq", "show", garbage["id"])
    assert code == 0 and "not valid JSON" in out and '"raw"' in out

    code, out, _ = _cli(capsys, "status", "--json")
    assert code == 0
    queue = json.loads(out)["queues"]["extract"]
    assert queue["dead_redis"] == len(bad) and queue["dead_mirror"] == len(bad)

    code, out, err = _cli(capsys, "dlq", "replay", garbage["id"])
    assert code == 1 and "is malformed" in err and "refused 1 malformed" in out
    assert client.zcard(f"{NS}:extract.XQ") == len(bad)  # nothing was sent, nothing moved

    code, out, _ = _cli(capsys, "dlq", "purge", "--yes")
    assert code == 0 and out.strip() == f"purged {len(bad)} dead letters"
    assert client.zcard(f"{NS}:extract.XQ") == 0 and client.hlen(f"{NS}:extract.XQ.msgs") == 0
    assert DeadLetterStore(db, client).list() == []


def test_dlq_commands_survive_garbage_dead_letters_in_redis(
    db: Any, redis_url: str, env: None, capsys: Any
) -> None:
    """Dead letters that no mirror recorded, planted straight into Redis's dead-letter set."""
    client = redis.Redis.from_url(redis_url)
    planted = {
        "garbage": b"\x00\x01 not json at all",
        "string": b'"just a string"',
        "bad options": json.dumps(_envelope(options="x")).encode(),
        "bad retries": json.dumps(_envelope(options={"retries": "3x", "traceback": 7})).encode(),
        "bad kwargs": json.dumps(_envelope(kwargs=[1, 2], args={"a": 1})).encode(),
    }
    ids = {}
    for n, (name, raw) in enumerate(planted.items()):
        ids[name] = str(uuid.uuid4())
        client.zadd(f"{NS}:extract.XQ", {ids[name]: 1_700_000_000_000 + n})
        client.hset(f"{NS}:extract.XQ.msgs", ids[name], raw)

    code, out, err = _cli(capsys, "dlq", "list", "--json")
    assert code == 0, err
    letters = {letter["redis_message_id"]: letter for letter in json.loads(out)}
    assert set(letters) == set(ids.values())
    assert all(letter["malformed"] and not letter["in_mirror"] for letter in letters.values())
    assert "option retries is a str" in letters[ids["bad retries"]]["malformed"]
    code, out, _ = _cli(capsys, "dlq", "list")
    assert code == 0 and "5 dead letters" in out
    for redis_id in ids.values():
        code, out, err = _cli(capsys, "dlq", "show", redis_id)
        assert code == 0 and "malformed" in out, err

    code, out, err = _cli(capsys, "dlq", "replay", "--all")
    assert code == 1 and out.strip().endswith("refused 5 malformed")
    assert err.count("is malformed") == 5
    assert client.zcard(f"{NS}:extract.XQ") == 5 and client.llen(f"{NS}:extract") == 0

    code, out, _ = _cli(capsys, "dlq", "purge", "--yes")
    assert code == 0 and out.strip() == "purged 5 dead letters"
    assert client.zcard(f"{NS}:extract.XQ") == 0 and client.hlen(f"{NS}:extract.XQ.msgs") == 0
