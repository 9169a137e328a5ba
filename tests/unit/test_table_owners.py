"""One writer per table: every statement in the code that writes a table (``INSERT INTO``,
``UPDATE``, ``DELETE FROM``, ``COPY ... FROM``, a peewee model's ``insert``) is in the one module
that owns it. What the database does by its own rules (triggers, the functions of the
migrations) is the migrations'; this reads the application's code."""

from __future__ import annotations

import configparser
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def packages() -> list[str]:
    """The server's packages, as the import contracts name them (setup.cfg), and the client."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    names = config["importlinter"]["root_packages"].split()
    return ["client/ibex_client" if name == "ibex_client" else name for name in names]


WRITE = re.compile(
    r"\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM|COPY)\s+(ibex_core|ibex_memory)\.(\w+)", re.I
)
#: peewee models by the table they map (models/), written with Model.insert / insert_many.
MODEL_WRITE = re.compile(r"\b(\w+)\.(?:insert|insert_many|update|delete)\(")
MODEL_TABLES = {
    "Checkpoint": "ibex_core.checkpoints",
    "CheckpointPayload": "ibex_core.checkpoint_payloads",
    "SessionRow": "ibex_core.sessions",
    "AgentRow": "ibex_core.agents",
    "Org": "ibex_core.orgs",
    "User": "ibex_core.users",
}

#: The owner of each table the code writes: the one module whose statements write it.
OWNERS = {
    "ibex_core.orgs": "sessions/orgs.py",
    "ibex_core.agents": "sessions/orgs.py",
    "ibex_core.sessions": "sessions/store.py",
    "ibex_core.checkpoints": "sessions/turns.py",
    "ibex_core.checkpoint_payloads": "sessions/turns.py",
    "ibex_core.users": "sessions/users.py",
    "ibex_core.extraction_turns": "extraction/turns.py",
    "ibex_core.extraction_slots": "extraction/turns.py",
    "ibex_core.dead_letters": "extraction/deadletter_rows.py",
    "ibex_core.org_budgets": "extraction/budgets.py",
    "ibex_memory.memories": "memories/store.py",
    "ibex_memory.embedding_models": "memories/vectors.py",
    "ibex_memory.api_tokens": "memories/tokens.py",
}


def writers() -> dict[str, set[str]]:
    """Table -> the modules whose code holds a statement writing it."""
    found: dict[str, set[str]] = defaultdict(set)
    for package in packages():
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            name = str(path.relative_to(ROOT))
            for schema, table in WRITE.findall(text):
                found[f"{schema}.{table}".lower()].add(name)
            for model in MODEL_WRITE.findall(text):
                if model in MODEL_TABLES:
                    found[MODEL_TABLES[model]].add(name)
    return dict(found)


def test_the_scan_finds_statements_and_model_writes() -> None:
    text = 'x = "UPDATE ibex_core.sessions SET a = 1"; Checkpoint.insert_many(rows)'
    assert WRITE.findall(text) == [("ibex_core", "sessions")]
    assert MODEL_WRITE.findall(text) == ["Checkpoint"]


def test_each_table_has_one_writer_module() -> None:
    found = writers()
    several = {table: sorted(mods) for table, mods in found.items() if len(mods) > 1}
    assert several == {}, f"tables written by more than one module: {several}"
    assert {table: next(iter(mods)) for table, mods in found.items()} == OWNERS
