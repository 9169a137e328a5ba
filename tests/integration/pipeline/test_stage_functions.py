"""The stage functions of migration 000010 (``ibex_core.begin_extract`` and the rest): row-level
security applies to every row they touch, only the owner may call them, a call sent again after
its answer was lost counts nothing twice, and each is one statement with no transaction of its
own around it; the claim, a slot's record and the pointer's move commit without awaiting the
WAL flush, the result with it."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg2
import pytest

from core.errors import RowNotFoundError
from extraction.dispatch import run_message
from extraction.stages import StageDeps, complete_turn, extract_turn, scan, write_memory
from extraction.turns import NOT_AWAITED
from extraction.values import Busy, Claimed, TurnRef
from schema.messages import ActorName
from sessions.turns import TurnInput
from tests.integration.pipeline.helpers import make_session, pointer_of, turn_rows


def test_another_orgs_id_finds_none_of_the_turns_rows(db: Any, store: Any, deps: StageDeps) -> None:
    session = make_session(store, 2)
    other = make_session(store, 1, org="globex")
    scan(deps)
    extract_turn(deps, session.org_id, session.session_id, 1)  # a result and slots to see
    for turn in (1, 2):
        foreign = TurnRef(other.org_id, session.session_id, turn)
        with pytest.raises(RowNotFoundError):
            deps.turns.begin_extract(foreign, claim_seconds=60, lease_seconds=60, max_attempts=3)
        with pytest.raises(RowNotFoundError):
            deps.turns.load_slot(foreign, 0)
        with pytest.raises(RowNotFoundError):
            deps.turns.record_slot(
                foreign, 0, idempotency_key=str(uuid.uuid4()), memory_id=None, outcome="created"
            )
        with pytest.raises(RowNotFoundError):
            deps.turns.complete_turn(foreign)
        assert deps.turns.turn_status(foreign) is None
    rows = turn_rows(db, session.session_id)
    assert (rows[1]["state"], rows[1]["slots"], rows[2]["state"]) == ("extracted", 0, "pending")
    assert rows[2]["attempts"] == 0


def test_the_pointer_walks_the_done_turns_in_sequence_and_stops_at_the_first_gap(
    db: Any, store: Any, deps: StageDeps
) -> None:
    """complete_turn's walk (migration 000035 reads the turn rows after the pointer until the
    first that is not done): turns finished out of order move the pointer over every done turn
    in sequence, and no further than a turn not done or a turn with no row yet (appended after
    the scan)."""
    ref = make_session(store, 5)
    writes = {
        m.kwargs["turn_index"]: run_message(deps, ActorName.EXTRACT, m.kwargs)
        for m in scan(deps).sent
    }
    store.append_turns(
        ref.org_id,
        ref.session_id,
        [TurnInput(messages=[{"role": "user", "content": "later"}], completion={})],
    )

    finish = _finisher(db, deps, ref.session_id, writes)
    assert [finish(turn) for turn in (3, 2, 5, 1, 4)] == [0, 0, 0, 3, 5]
    assert sorted(turn_rows(db, ref.session_id)) == [1, 2, 3, 4, 5]  # turn 6: no row yet
    complete_turn(deps, ref.org_id, ref.session_id, 5)  # delivered again: stays
    assert pointer_of(db, ref.session_id) == 5


def test_the_pointer_stops_before_a_turn_whose_row_is_missing(
    db: Any, store: Any, deps: StageDeps
) -> None:
    """A turn without a row between done turns (deleted here, as the owner) counts as not
    done: the walk stops before it, although the rows after it are done."""
    ref = make_session(store, 4)
    writes = {
        m.kwargs["turn_index"]: run_message(deps, ActorName.EXTRACT, m.kwargs)
        for m in scan(deps).sent
    }
    finish = _finisher(db, deps, ref.session_id, writes)
    db.execute_sql(
        "DELETE FROM ibex_core.extraction_turns WHERE session_id = %s AND turn_index = 3",
        (str(ref.session_id),),
    )
    assert [finish(turn) for turn in (4, 2, 1)] == [0, 0, 2]
    assert sorted(turn_rows(db, ref.session_id)) == [1, 2, 4]


def _finisher(
    db: Any, deps: StageDeps, session_id: uuid.UUID, writes: dict[int, list[Any]]
) -> Callable[[int], int]:
    """A function that runs a turn's writes and what they send (its pointer step) to the
    end, and answers the session's pointer then."""

    def finish(turn: int) -> int:
        pending = list(writes[turn])
        while pending:
            message = pending.pop(0)
            pending += run_message(deps, message.actor_name, message.kwargs)
        return pointer_of(db, session_id)

    return finish


def test_the_stage_functions_are_the_owners_alone(db: Any, database_url: str) -> None:
    conn = psycopg2.connect(database_url)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SET ROLE ibex_app")
            with pytest.raises(psycopg2.errors.InsufficientPrivilege):
                cur.execute(
                    "SELECT * FROM ibex_core.complete_turn(%s::uuid, %s::uuid, 1)",
                    (str(uuid.uuid4()), str(uuid.uuid4())),
                )
            cur.execute("SELECT ibex_core.stage_pause('any point')")  # the seam: callable
    finally:
        conn.close()


def test_a_claim_sent_again_with_its_token_is_taken_again_without_a_second_count(
    db: Any, store: Any, deps: StageDeps
) -> None:
    # What a call sent again on a fresh connection does when the first one committed and its
    # answer was lost: the same token finds its own live claim.
    session = make_session(store, 1)
    scan(deps)
    token = str(uuid.uuid4())
    params = (str(session.org_id), str(session.session_id), 1, 60, 60, 3, 1, None, True, token)
    sql = "SELECT * FROM ibex_core.begin_extract(%s, %s, %s, %s, %s, %s, %s, %s::uuid, %s, %s)"
    first = db.execute_sql(sql, params).fetchone()
    again = db.execute_sql(sql, params).fetchone()
    assert (first[0], first[9]) == ("claimed", 1)
    assert (again[0], again[9]) == ("claimed", 1)
    assert [t["turn_index"] for t in again[11]] == [1]
    row = turn_rows(db, session.session_id)[1]
    assert (row["attempts"], row["llm_calls"]) == (1, 1)
    # Any other delivery still finds the claim live and waits.
    begun = deps.turns.begin_extract(
        TurnRef(session.org_id, session.session_id, 1),
        claim_seconds=60,
        lease_seconds=60,
        max_attempts=3,
    )
    assert isinstance(begun, Busy)


@contextlib.contextmanager
def recording(deps: StageDeps, after: Callable[[str], None] | None = None) -> Iterator[list[str]]:
    """Every statement sent through the store's cursors (BEGIN and COMMIT too), in order;
    ``after(sql)`` is called once each has run."""
    sent: list[str] = []
    real = deps.store.db.cursor

    class Recording:
        def __init__(self, cursor: Any) -> None:
            self.cursor = cursor

        def execute(self, sql: str, params: Any = None) -> Any:
            sent.append(sql)
            result = self.cursor.execute(sql, params)
            if after is not None:
                after(sql)
            return result

        def __getattr__(self, name: str) -> Any:
            return getattr(self.cursor, name)

    deps.store.db.cursor = lambda *a, **k: Recording(real(*a, **k))  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        del deps.store.db.cursor


def test_a_stage_step_is_one_statement(db: Any, store: Any, deps: StageDeps) -> None:
    session = make_session(store, 1)
    scan(deps)
    ref = TurnRef(session.org_id, session.session_id, 1)
    with recording(deps) as sent:
        begun = deps.turns.begin_extract(ref, claim_seconds=60, lease_seconds=60, max_attempts=3)
        status = deps.turns.turn_status(ref)
    assert isinstance(begun, Claimed) and [t.turn_index for t in begun.turns] == [1]
    assert status is not None and status.state == "pending"
    # One round trip each; the claim's carries the setting that its commit is not awaited.
    assert len(sent) == 2
    assert sent[0].startswith(NOT_AWAITED + "SELECT * FROM ibex_core.begin_extract(")
    assert sent[1].startswith("SELECT * FROM ibex_core.turn_status(")


def test_only_the_result_awaits_its_commit(db: Any, store: Any, deps: StageDeps) -> None:
    """Every transition of a turn is sent once; the claim, the slot records and the pointer's
    move with ``synchronous_commit`` off for their own transaction, and the result (whose loss
    would mean a second LLM call) with the server's setting."""
    session = make_session(store, 1)
    scan(deps)
    ref = TurnRef(session.org_id, session.session_id, 1)
    settings: list[str] = []
    real = deps.store.db.cursor

    def setting_after(sql: str) -> None:
        if sql.startswith(NOT_AWAITED):
            # The setting was local to that statement's transaction: it is over.
            with real() as probe:
                probe.execute("SELECT current_setting('synchronous_commit')")
                settings.append(probe.fetchone()[0])

    with recording(deps, setting_after) as sent:
        sends = extract_turn(deps, ref.org_id, ref.session_id, 1)
        for send in sends:
            write_memory(deps, **send.kwargs)
        complete_turn(deps, ref.org_id, ref.session_id, 1)
    by_function = {
        s.removeprefix(NOT_AWAITED).split("(")[0].split()[-1]: s.startswith(NOT_AWAITED)
        for s in sent
        if "ibex_core." in s
    }
    assert by_function["ibex_core.begin_extract"] is True
    assert by_function["ibex_core.persist_result"] is False
    assert by_function["ibex_core.record_slot"] is True
    assert by_function["ibex_core.complete_turn"] is True
    assert settings and set(settings) == {"on"}
    assert turn_rows(db, session.session_id)[1]["state"] == "done"
