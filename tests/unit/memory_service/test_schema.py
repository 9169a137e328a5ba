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
        "user": None,
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


def test_user_fields_are_exclusive_and_all_users_names_nobody() -> None:
    user = "55555555-5555-4555-8555-555555555555"
    loaded = MemoryListQuerySchema().load({"user": "dana-17", "include_shared": "false"})
    assert (loaded["user"], loaded["include_shared"]) == ("dana-17", False)
    with pytest.raises(ValidationError) as both:
        MemoryListQuerySchema().load({"user": "dana-17", "user_id": user})
    assert list(both.value.messages) == ["user_id"]
    with pytest.raises(ValidationError) as everyone:
        MemoryListQuerySchema().load({"user": "dana-17", "all_users": "true"})
    assert list(everyone.value.messages) == ["all_users"]
    with pytest.raises(ValidationError) as both_on_write:
        MemoryCreateSchema().load({"agent_id": AGENT, "content": "x", "user": "d", "user_id": user})
    assert list(both_on_write.value.messages) == ["user_id"]
    with pytest.raises(ValidationError):
        MemoryCreateSchema().load({"agent_id": AGENT, "content": "x", "user": "a\nb"})


def test_list_query() -> None:
    assert MemoryListQuerySchema().load({}) == {
        "limit": 50,
        "include_superseded": False,
        "user": None,
        "user_id": None,
        "include_shared": True,
        "all_users": False,
    }
    assert MemoryListQuerySchema().load({"limit": "200"})["limit"] == 200
    with pytest.raises(ValidationError):
        MemoryListQuerySchema().load({"limit": "201"})
