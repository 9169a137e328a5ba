"""The request schema: what it accepts, what it refuses, and its agreement with the models."""

from __future__ import annotations

import ast
import pathlib
import uuid

import pytest
from marshmallow import ValidationError

from schema.memory import MemoryCreateSchema, MemoryListQuerySchema

AGENT = str(uuid.uuid4())


def test_schema_module_imports_no_io_library() -> None:
    import schema.memory

    tree = ast.parse(pathlib.Path(schema.memory.__file__).read_text())
    imported = {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    } | {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert imported.isdisjoint({"peewee", "httpx", "redis", "dramatiq", "falcon", "psycopg2"})


def test_defaults() -> None:
    loaded = MemoryCreateSchema().load({"agent_id": AGENT, "content": "x"})
    assert loaded == {
        "agent_id": uuid.UUID(AGENT),
        "content": "x",
        "kind": "fact",
        "source": None,
        "metadata": {},
    }


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"content": ""}, "content"),
        ({"content": " \t\n"}, "content"),
        ({"content": "a\x00"}, "content"),
        ({"content": "\ud800"}, "content"),
        ({"content": "x" * 4001}, "content"),
        ({"kind": "rumour"}, "kind"),
        ({"metadata": {"a": float("nan")}}, "metadata"),
        ({"metadata": {"a": "\x00"}}, "metadata"),
        ({"metadata": {"a": "x" * 20000}}, "metadata"),
        ({"source": {"session_id": AGENT, "turn_index": True}}, "source"),
        ({"source": {"session_id": AGENT, "turn_index": 1.0}}, "source"),
        ({"source": {"session_id": AGENT, "ordinal": 2**31}}, "source"),
        ({"agent_id": None}, "agent_id"),
        ({"unexpected": 1}, "unexpected"),
    ],
)
def test_refusals_name_the_field(patch: dict, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        MemoryCreateSchema().load({"agent_id": AGENT, "content": "x", **patch})
    assert list(info.value.messages) == [field]


def test_a_4000_character_content_is_accepted() -> None:
    assert MemoryCreateSchema().load({"agent_id": AGENT, "content": "é" * 4000})["content"]


def test_list_query() -> None:
    assert MemoryListQuerySchema().load({}) == {"limit": 50, "include_superseded": False}
    assert MemoryListQuerySchema().load({"limit": "200"})["limit"] == 200
    with pytest.raises(ValidationError):
        MemoryListQuerySchema().load({"limit": "201"})
