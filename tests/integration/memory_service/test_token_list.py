"""``ibex token list`` names each org token's org by its slug."""

from __future__ import annotations

import json

import pytest

from cli import main


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, database_url: str, redis_url: str, db) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("REDIS_URL", redis_url)


def test_token_list_shows_org_slugs(cli_env, capsys, store) -> None:  # type: ignore[no-untyped-def]
    create = ["token", "create", "--scope", "memory:read"]
    assert main([*create, "--org", "globex", "--create-org", "--name", "app"]) == 0
    assert main([*create, "--service", "--name", "worker"]) == 0
    capsys.readouterr()
    org_id = store.find_org("globex")

    assert main(["token", "list"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["ID", "PREFIX", "OWNER"]
    owners = {line.split()[-1]: line.split()[2] for line in table[1:]}
    assert owners == {"app": "globex", "worker": "service"}
    assert str(org_id) not in "\n".join(table)

    assert main(["token", "list", "--json"]) == 0
    listed = {entry["name"]: entry for entry in json.loads(capsys.readouterr().out)}
    assert (listed["app"]["org"], listed["app"]["org_id"]) == ("globex", str(org_id))
    assert (listed["worker"]["org"], listed["worker"]["org_id"]) == (None, None)
