"""``ibex search``: a table on a terminal, stable JSON, errors for unknown orgs and agents."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cli import main
from memories.store import MemoryStore, NewMemory


@pytest.fixture
def seeded(monkeypatch: pytest.MonkeyPatch, database_url: str, store) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("DATABASE_URL", database_url)
    org_id = store.ensure_org("acme")
    agent_id = store.ensure_agent(org_id, "bot")
    session = store.create_session(org_id, agent_id, "conv-cli")
    memories = MemoryStore(store.db)
    ids = {}
    for ordinal, content in enumerate(["Dana is allergic to peanuts.", "Dana lives in Lisbon."]):
        row = memories.create(
            org_id,
            NewMemory(
                agent_id=agent_id,
                content=content,
                content_hash=f"{ordinal:064x}",
                kind="fact",
                metadata={},
                session_id=session.id,
                turn_index=1,
                ordinal=ordinal,
                idempotency_key=None,
                fingerprint="",
            ),
        ).row
        assert row is not None
        ids[content] = str(row.id)
    return {"org_id": org_id, "agent_id": agent_id, "ids": ids}


def test_json_output(seeded: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["search", "what is Dana allergic to", "--org", "acme", "--agent", "bot", "--json"])
    assert code == 0
    items = json.loads(capsys.readouterr().out)["items"]
    assert [i["id"] for i in items] == [
        seeded["ids"]["Dana is allergic to peanuts."],
        seeded["ids"]["Dana lives in Lisbon."],
    ]
    assert set(items[0]) >= {"score", "signals", "snippet", "content", "kind", "source"}
    by_id = ["search", "Lisbon", "--org", "acme", "--agent", str(seeded["agent_id"]), "--json"]
    assert main(by_id) == 0
    assert [i["content"] for i in json.loads(capsys.readouterr().out)["items"]] == [
        "Dana lives in Lisbon."
    ]


def test_table_output(seeded: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "peanuts", "--org", "acme", "--agent", "bot", "--limit", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["#", "SCORE", "TEXT", "TRGM", "SEM", "KIND", "CONTENT"]
    assert len(lines) == 2 and lines[1].endswith("Dana is allergic to peanuts.")
    assert main(["search", "zeppelin", "--org", "acme", "--agent", "bot"]) == 0
    assert capsys.readouterr().out == "no memories match\n"


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["--org", "nope", "--agent", "bot"], 1, "no org 'nope'"),
        (["--org", "acme", "--agent", "ghost"], 1, "no agent 'ghost'"),
        (["--org", "acme", "--agent", "00000000-0000-4000-8000-000000000000"], 1, "no agent"),
        (["--org", "acme", "--agent", "bot", "--limit", "51"], 2, "must be 1-50"),
        (["--org", "acme", "--agent", "bot", "--user", "nobody"], 1, "no user 'nobody'"),
        (["--org", "acme"], 2, "--agent"),
    ],
)
def test_errors(
    seeded: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    code: int,
    message: str,
) -> None:
    if code == 2:
        with pytest.raises(SystemExit) as exited:
            main(["search", "peanuts", *argv])
        assert exited.value.code == 2
    else:
        assert main(["search", "peanuts", *argv]) == code
    assert message in capsys.readouterr().err
