"""``ibex prune``: the per-turn extraction state of done turns the pointer has passed goes, and
nothing is ever extracted twice for it.

The clock is simulated by moving ``done_at`` back (``backdate``): that is the only time
``prune_done`` reads.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import uuid
from typing import Any

import pytest

from cli import main
from cli.scheduler import prune_hourly
from core.config import Settings
from extraction.dispatch import run_message
from extraction.stages import scan
from extraction.turns import Pruned, TurnStore
from schema.messages import ActorName
from sessions.turns import TurnInput
from tests.integration.pipeline.helpers import (
    FakeMemoryService,
    FakeProvider,
    Harness,
    make_session,
    pointer_of,
    turn_rows,
    wait_for,
)


def backdate(db: Any, session_id: uuid.UUID, days: int) -> None:
    """Simulated clock: the session's done turns were done ``days`` ago."""
    db.execute_sql(
        "UPDATE ibex_core.extraction_turns SET done_at = now() - make_interval(days => %s)"
        " WHERE session_id = %s AND state = 'done'",
        (days, str(session_id)),
    )


def slot_count(db: Any, session_id: uuid.UUID) -> int:
    return int(
        db.execute_sql(
            "SELECT count(*) FROM ibex_core.extraction_slots WHERE session_id = %s",
            (str(session_id),),
        ).fetchone()[0]
    )


@pytest.fixture
def cli_env(database_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("REDIS_URL", redis_url)


def test_a_pruned_session_is_skipped_never_extracted_again_and_grows_on_new_turns_only(
    store: Any,
    db: Any,
    deps: Any,
    harness: Harness,
    provider: FakeProvider,
    memory: FakeMemoryService,
    cli_env: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    old = make_session(store, 3)
    recent = make_session(store, 2)
    waiting = make_session(store, 2)  # turn 1 never finishes: the pointer stays below turn 2
    provider.reject_always(waiting.session_id, 1)
    harness.drain(scan(deps).sent, dead_letter=lambda message, exc: True)
    assert (pointer_of(db, old.session_id), pointer_of(db, waiting.session_id)) == (3, 0)
    assert turn_rows(db, waiting.session_id)[2]["state"] == "done"
    backdate(db, old.session_id, 40)
    backdate(db, waiting.session_id, 40)
    backdate(db, recent.session_id, 5)
    calls, posts = provider.total_calls, memory.posts

    assert main(["prune", "--done-older-than", "30d", "--dry-run", "--json"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert (dry["dry_run"], dry["turns"], dry["slots"]) == (True, 3, 6)
    assert len(turn_rows(db, old.session_id)) == 3  # a dry run deletes nothing

    # Batches of 2 turns: the keyset walk crosses batch boundaries.
    assert main(["prune", "--done-older-than", "30d", "--yes", "--batch-size", "2"]) == 0
    assert "pruned the extraction state of 3 done turns" in capsys.readouterr().out
    assert turn_rows(db, old.session_id) == {} and slot_count(db, old.session_id) == 0
    assert len(turn_rows(db, recent.session_id)) == 2  # done 5 days ago: kept
    assert set(turn_rows(db, waiting.session_id)) == {1, 2}  # above its pointer: kept
    assert pointer_of(db, old.session_id) == 3

    # The scan skips the pruned session; a late redelivery of one of its turns is "done".
    assert [m for m in scan(deps).sent if m.kwargs["session_id"] == str(old.session_id)] == []
    late = {"org_id": str(old.org_id), "session_id": str(old.session_id), "turn_index": 2}
    assert run_message(deps, ActorName.EXTRACT, late) == []
    assert (provider.total_calls, memory.posts) == (calls, posts)
    assert turn_rows(db, old.session_id) == {}

    # The session grows: only its new turns are extracted and written.
    store.append_turns(
        old.org_id,
        old.session_id,
        [
            TurnInput(
                messages=[{"role": "user", "content": f"I moved to city {i}."}],
                completion={"role": "assistant", "content": "Noted."},
            )
            for i in (4, 5)
        ],
    )
    harness.drain(scan(deps).sent)
    assert {turn for (session, turn), n in provider.calls.items() if session == old.session_id} == {
        1,
        2,
        3,
        4,
        5,
    }
    assert all(n == 1 for n in provider.calls.values())
    assert provider.total_calls == calls + 2
    assert memory.posts == posts + 4  # two memories for each new turn
    assert set(turn_rows(db, old.session_id)) == {4, 5}
    assert pointer_of(db, old.session_id) == 5


def test_prune_without_yes_and_no_terminal_refuses(
    store: Any, db: Any, deps: Any, harness: Harness, cli_env: None, capsys, monkeypatch
) -> None:
    ref = make_session(store, 1)
    harness.drain(scan(deps).sent)
    backdate(db, ref.session_id, 40)
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    assert main(["prune", "--done-older-than", "30d"]) == 1
    assert "refusing without --yes" in capsys.readouterr().err
    assert len(turn_rows(db, ref.session_id)) == 1


def test_prune_reports_its_progress_per_batch(
    store: Any, db: Any, deps: Any, harness: Harness
) -> None:
    ref = make_session(store, 5)
    harness.drain(scan(deps).sent)
    backdate(db, ref.session_id, 2)
    seen: list[Pruned] = []
    cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    turns = TurnStore(store.db)
    assert turns.count_prunable(cutoff) == Pruned(5, 10)
    assert turns.prune_done(cutoff, batch_size=2, progress=seen.append) == Pruned(5, 10)
    assert seen == [Pruned(2, 4), Pruned(4, 8), Pruned(5, 10)]
    assert turns.prune_done(cutoff) == Pruned()


def test_the_scheduler_prunes_when_prune_done_after_days_is_set(
    store: Any, db: Any, deps: Any, harness: Harness, database_url: str, redis_url: str, capsys
) -> None:
    kept = make_session(store, 1)
    ref = make_session(store, 2)
    harness.drain(scan(deps).sent)
    backdate(db, ref.session_id, 31)
    backdate(db, kept.session_id, 29)
    settings = Settings.from_env(
        {"DATABASE_URL": database_url, "REDIS_URL": redis_url, "PRUNE_DONE_AFTER_DAYS": "30"}
    )
    stop = threading.Event()
    pruner = threading.Thread(target=prune_hourly, args=(settings, stop))
    pruner.start()
    try:
        wait_for(lambda: not turn_rows(db, ref.session_id), "the hourly prune")
    finally:
        stop.set()
    pruner.join(5)
    assert not pruner.is_alive()
    assert turn_rows(db, ref.session_id) == {}
    assert len(turn_rows(db, kept.session_id)) == 1
    assert "pruned the extraction state of 2 done turns" in capsys.readouterr().out
