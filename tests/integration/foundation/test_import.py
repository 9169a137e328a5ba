"""``ibex import``: the JSON Lines format of the README, through the real CLI."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg2
import pytest

from cli import main
from cli.stack.processes import free_port
from extraction.scan_queries import ScanQueries
from extraction.turns import TurnStore
from models import Checkpoint, CheckpointPayload, SessionRow
from sessions.turns import content_digest


def _line(session: str = "conv-1", turns: int = 2, **extra) -> str:
    record = {
        "org": "acme",
        "agent": "support-bot",
        "session": session,
        "status": "completed",
        "model": "gpt-4o-mini",
        "provider": "openai",
        "turns": [
            {
                "messages": [{"role": "user", "content": f"message {i}"}],
                "completion": {"role": "assistant", "content": f"reply {i}"},
                "prompt_tokens": 20,
                "completion_tokens": 5,
                "latency_ms": 600,
            }
            for i in range(1, turns + 1)
        ],
    }
    record.update(extra)
    return json.dumps(record)


@pytest.fixture
def run_import(db, database_url, monkeypatch, tmp_path: Path, capsys):
    monkeypatch.setenv("DATABASE_URL", database_url)

    def run(*lines: str | bytes, stdin: bool = False, options: tuple[str, ...] = ()):
        data = b"".join((ln if isinstance(ln, bytes) else ln.encode()) + b"\n" for ln in lines)
        if stdin:
            monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
            code = main(["import", *options, "-"])
        else:
            path = tmp_path / "sessions.jsonl"
            path.write_bytes(data)
            code = main(["import", *options, str(path)])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def _sessions(db) -> dict[str, SessionRow]:
    # Read as the owner (superuser) to see every org.
    return {s.external_id: s for s in SessionRow.select()}


def test_a_good_file_imports_everything(db, run_import) -> None:
    code, out, err = run_import(_line("conv-1", 2), _line("conv-2", 3))
    assert code == 0, err
    assert out.strip() == (
        "2 sessions created, 0 extended, 0 unchanged, 5 turns added, 0 lines rejected"
    )
    sessions = _sessions(db)
    assert sessions["conv-1"].turn_count == 2 and sessions["conv-2"].turn_count == 3
    assert sessions["conv-1"].status == "completed"
    assert sessions["conv-1"].completed_at is not None
    assert sessions["conv-2"].prompt_tokens == 60
    first = (
        Checkpoint.select()
        .where(Checkpoint.session_id == sessions["conv-1"].id, Checkpoint.turn_index == 1)
        .get()
    )
    assert first.messages_hash == content_digest([{"role": "user", "content": "message 1"}])
    payload = CheckpointPayload.get(CheckpointPayload.checkpoint_id == first.id)
    assert payload.completion == {"role": "assistant", "content": "reply 1"}


def test_bad_lines_are_reported_and_good_lines_kept(db, run_import) -> None:
    bad_role = json.loads(_line("conv-4"))
    bad_role["turns"][1]["messages"][0]["role"] = ""
    lines = [
        _line("conv-1"),
        "{not json",
        _line("conv-2", status="finished"),
        json.dumps(bad_role),
        json.dumps({"org": "acme", "agent": "support-bot", "turns": []}),
        _line("conv-3", turns=1, model=7),
        "[1, 2]",
        _line("conv-5"),
    ]
    code, out, err = run_import(*lines)
    assert code == 1
    assert "2 sessions created" in out and "6 lines rejected" in out
    assert "line 2: malformed JSON" in err
    assert "line 3: invalid session: status: Must be one of" in err
    assert "line 4: invalid session: turns[1].messages[0].role: must not be empty" in err
    assert "line 5: invalid session: session: Missing data for required field" in err
    assert "line 6: invalid session: model: Not a valid string" in err
    assert "line 7: a line must be a JSON object" in err
    assert set(_sessions(db)) == {"conv-1", "conv-5"}


def test_reimport_appends_only_new_turns_and_keeps_the_pointer(db, store, run_import) -> None:
    assert run_import(_line("conv-1", 2))[0] == 0
    session = _sessions(db)["conv-1"]
    TurnStore(store.db).advance_pointer(session.org_id, session.id, 2)
    code, out, _ = run_import(_line("conv-1", 4))
    assert code == 0
    assert "0 sessions created, 1 extended, 0 unchanged, 2 turns added" in out
    again = _sessions(db)["conv-1"]
    assert (again.turn_count, again.last_extracted_turn) == (4, 2)
    assert Checkpoint.select().where(Checkpoint.session_id == session.id).count() == 4
    code, out, _ = run_import(_line("conv-1", 4))
    assert code == 0 and "1 unchanged, 0 turns added" in out


def test_a_changed_turn_is_rejected_and_nothing_of_the_line_lands(db, run_import) -> None:
    assert run_import(_line("conv-1", 2))[0] == 0
    changed = json.loads(_line("conv-1", 3))
    changed["turns"][0]["completion"]["content"] = "a different reply"
    code, _out, err = run_import(json.dumps(changed))
    assert code == 1
    assert "line 1: turn 1 differs from the stored turn" in err
    assert _sessions(db)["conv-1"].turn_count == 2  # turn 3 was not appended either


def test_a_zero_turn_session_is_valid_and_is_not_a_candidate(db, store, run_import) -> None:
    code, out, _ = run_import(_line("empty", 0))
    assert code == 0 and "1 session created" in out and "0 turns added" in out
    assert _sessions(db)["empty"].turn_count == 0
    assert ScanQueries(store.db).candidates(limit=10) == []


def test_standard_input(db, run_import) -> None:
    code, out, _ = run_import(_line("conv-1", 1), "", _line("conv-2", 1), stdin=True)
    assert code == 0
    assert "2 sessions created" in out
    assert set(_sessions(db)) == {"conv-1", "conv-2"}


def test_status_defaults_to_completed_and_can_move_on(db, run_import) -> None:
    record = json.loads(_line("conv-1", 1))
    del record["status"]
    assert run_import(json.dumps(record))[0] == 0
    assert _sessions(db)["conv-1"].status == "completed"
    assert run_import(_line("conv-2", 1, status="active"))[0] == 0
    assert _sessions(db)["conv-2"].completed_at is None
    assert run_import(_line("conv-2", 2, status="completed"))[0] == 0
    assert _sessions(db)["conv-2"].status == "completed"
    assert _sessions(db)["conv-2"].completed_at is not None


def test_a_missing_file_is_an_error(db, database_url, monkeypatch, capsys) -> None:
    monkeypatch.setenv("DATABASE_URL", database_url)
    assert main(["import", "/nonexistent/file.jsonl"]) == 1
    assert "cannot read /nonexistent/file.jsonl" in capsys.readouterr().err


def test_import_without_a_database_url_fails_closed(monkeypatch, capsys) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    assert main(["import", "-"]) == 1
    assert "DATABASE_URL" in capsys.readouterr().err


def _nested(depth: int) -> object:
    value: object = "deep"
    for _ in range(depth):
        value = [value]
    return value


def test_each_bad_line_is_rejected_by_number_and_the_rest_imports(db, run_import) -> None:
    deep = json.loads(_line("deep"))
    deep["turns"][0]["messages"][0]["content"] = _nested(200)
    lines: list[str | bytes] = [
        _line("conv-1"),
        _line("conv-bad-utf8").encode().replace(b"message 1", b"message \xff\xfe"),
        _line("conv-after-bad-utf8"),
        _line("conv-\u0000-nul"),
        _line("conv-2").replace("reply 2", "reply \\ud800"),
        json.dumps(deep),
        _line("conv-3").replace('"user"', '"us\\u0007er"', 1),
        _line("conv-4").replace("message 1", "message\x01one"),
        _line("conv-5").replace("message 1", "tab\\there\\r\\n ok \\ud83d\\ude00"),
    ]
    code, out, err = run_import(*lines)
    assert code == 1
    assert "3 sessions created" in out and "6 lines rejected" in out
    assert "line 2: not valid UTF-8: byte 0xff at byte offset" in err
    assert "line 4: session: contains a NUL character (U+0000)" in err
    assert "line 5: turns[1].completion.content: contains a lone surrogate (U+D800)" in err
    assert "line 6: nested deeper than 64 levels" in err
    assert "line 7: turns[0].messages[0].role: contains a control character (U+0007)" in err
    assert "line 8: malformed JSON: Invalid control character" in err
    assert "Traceback" not in err
    assert set(_sessions(db)) == {"conv-1", "conv-after-bad-utf8", "conv-5"}


def test_a_line_over_the_size_limit_is_skipped_and_the_next_one_imports(db, run_import) -> None:
    fits = _line("fits", 1)
    limit = len(fits.encode())
    over = _line("over", 1).replace("message 1", "message 1" + "x" * 5000)
    code, out, err = run_import(
        fits, over, _line("next", 1), options=("--max-line-bytes", str(limit))
    )
    assert code == 1
    assert f"line 2: line is {len(over.encode())} bytes, over the limit of {limit}" in err
    assert "2 sessions created" in out and "1 line rejected" in out
    assert set(_sessions(db)) == {"fits", "next"}


def test_json_output_lists_each_line_and_its_session(db, run_import) -> None:
    assert run_import(_line("old", 1), _line("same", 1))[0] == 0
    code, out, err = run_import(
        _line("new", 2), _line("old", 3), "{oops", _line("same", 1), options=("--json",)
    )
    assert code == 1
    assert err == ""
    document = json.loads(out)
    sessions = _sessions(db)
    assert document == {
        "lines": 4,
        "sessions_created": 1,
        "sessions_extended": 1,
        "sessions_unchanged": 1,
        "turns_added": 4,
        "lines_rejected": 1,
        "imported": [
            {
                "line": n,
                "org": "acme",
                "agent": "support-bot",
                "session": name,
                "session_id": str(sessions[name].id),
                "result": result,
                "turns_added": added,
            }
            for n, name, result, added in [
                (1, "new", "created", 2),
                (2, "old", "extended", 2),
                (4, "same", "unchanged", 0),
            ]
        ],
        "rejected": [{"line": 3, "error": document["rejected"][0]["error"]}],
        "stopped": None,
    }
    assert document["rejected"][0]["error"].startswith("malformed JSON")


def test_an_unreachable_database_is_reported_once(monkeypatch, tmp_path: Path, capsys) -> None:
    monkeypatch.setenv("DATABASE_URL", f"postgresql://postgres@127.0.0.1:{free_port()}/ibex")
    path = tmp_path / "sessions.jsonl"
    path.write_text("".join(_line(f"conv-{i}") + "\n" for i in range(5)))
    assert main(["import", str(path)]) == 1
    out, err = capsys.readouterr()
    # The start-up check every command shares answers before a line is read.
    assert err.count("\n") == 1, err
    assert err.startswith("ibex import: cannot connect to the database"), err
    assert "Traceback" not in err and out == ""


def test_json_output_of_an_import_stopped_by_the_database(
    monkeypatch, tmp_path: Path, capsys
) -> None:
    """The database goes away after the start-up check passed: the import command itself,
    run without that check, stops at the first line that needs the database."""
    from cli import build_parser, imports
    from core.config import Settings

    monkeypatch.setenv("DATABASE_URL", f"postgresql://postgres@127.0.0.1:{free_port()}/ibex")
    path = tmp_path / "sessions.jsonl"
    path.write_text("{bad\n" + "".join(_line(f"conv-{i}") + "\n" for i in range(3)))
    args = build_parser().parse_args(["import", "--json", str(path)])
    assert imports.run(args, Settings.from_env()) == 1
    out, err = capsys.readouterr()
    document = json.loads(out)
    assert document["lines"] == 2 and document["imported"] == []
    assert [r["line"] for r in document["rejected"]] == [1]
    assert document["stopped"]["line"] == 2
    assert document["stopped"]["error"].startswith("database unavailable:")
    assert "\n" not in document["stopped"]["error"]
    assert err.count("\n") == 1 and "stopped at line 2; what line 1 imported is committed" in err


def test_an_unmigrated_database_stops_the_import_once(
    postgres_server, monkeypatch, tmp_path: Path, capsys
) -> None:
    url = postgres_server.create("unmigrated")
    try:
        monkeypatch.setenv("DATABASE_URL", url)
        path = tmp_path / "sessions.jsonl"
        path.write_text("".join(_line(f"conv-{i}") + "\n" for i in range(5)))
        assert main(["import", str(path)]) == 1
        out, err = capsys.readouterr()
        assert err.count("\n") == 1, err
        assert "has no IBEX schema (never migrated): run `ibex migrate`" in err
        assert out == ""
    finally:
        postgres_server.drop(url)


def _spawn_import(database_url: str) -> tuple[str, subprocess.Popen[bytes]]:
    """``ibex import -`` in a child process whose connection has its own application_name."""
    app = f"ibex-import-{uuid.uuid4().hex[:8]}"
    sep = "&" if "?" in database_url else "?"
    env = {**os.environ, "DATABASE_URL": f"{database_url}{sep}application_name={app}"}
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "ibex"), "import", "-"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    return app, proc


def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _terminate(db, app: str) -> None:
    killed = db.execute_sql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
        (app,),
    ).fetchall()
    assert killed == [(True,)]


def _assert_stopped_at_line_3(proc: subprocess.Popen[bytes], out: bytes, err: bytes) -> None:
    assert proc.returncode == 1
    lines = err.decode().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("ibex import: stopped at line 3; what lines 1-2 imported is")
    assert "database unavailable" in lines[0]
    assert out.decode().strip() == (
        "2 sessions created, 0 extended, 0 unchanged, 4 turns added, 0 lines rejected"
    )


def test_a_connection_killed_between_lines_stops_the_import_with_one_message(
    db, database_url
) -> None:
    """Crash point: the importer's backend is terminated (pg_terminate_backend) while idle,
    after line 2 committed and before line 3 is read. Lines 1-2 stay imported, line 3 on are
    not, and the import ends with one message and exit status 1."""
    app, proc = _spawn_import(database_url)
    try:
        assert proc.stdin is not None
        proc.stdin.write(f"{_line('conv-1')}\n{_line('conv-2')}\n".encode())
        proc.stdin.flush()
        _wait_for(lambda: set(_sessions(db)) == {"conv-1", "conv-2"}, "lines 1-2 not imported")
        _terminate(db, app)
        rest = "".join(f"{_line(f'conv-{i}')}\n" for i in range(3, 8))
        out, err = proc.communicate(rest.encode(), timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _assert_stopped_at_line_3(proc, out, err)
    assert set(_sessions(db)) == {"conv-1", "conv-2"}


def test_a_connection_killed_inside_a_line_stops_the_import_and_rolls_the_line_back(
    db, database_url
) -> None:
    """Crash point: the importer's backend is terminated in the middle of line 3's
    transaction (waiting on a row lock that another transaction holds on line 3's org).
    Nothing of line 3 lands, lines 1-2 stay, one message, exit status 1."""
    blocker = psycopg2.connect(database_url)
    try:
        with blocker.cursor() as cur:
            cur.execute("INSERT INTO ibex_core.orgs (slug) VALUES ('blocked')")
        app, proc = _spawn_import(database_url)
        try:
            lines = [_line("conv-1"), _line("conv-2"), _line("conv-3", org="blocked")]
            lines += [_line(f"conv-{i}") for i in range(4, 8)]
            assert proc.stdin is not None
            proc.stdin.write("".join(f"{ln}\n" for ln in lines).encode())
            proc.stdin.close()
            _wait_for(
                lambda: (
                    db.execute_sql(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE application_name = %s AND wait_event_type = 'Lock'",
                        (app,),
                    ).fetchone()
                    == (1,)
                ),
                "line 3 never waited on the org's lock",
            )
            _terminate(db, app)
            proc.wait(timeout=30)
            assert proc.stdout is not None and proc.stderr is not None
            out, err = proc.stdout.read(), proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
    finally:
        blocker.rollback()
        blocker.close()
    _assert_stopped_at_line_3(proc, out, err)
    assert set(_sessions(db)) == {"conv-1", "conv-2"}
    assert db.execute_sql("SELECT slug FROM ibex_core.orgs ORDER BY slug").fetchall() == [("acme",)]
