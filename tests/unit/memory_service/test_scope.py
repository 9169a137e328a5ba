"""Whose memories a read sees, as SQL: one user's and the agent-wide ones, one user's alone,
the agent-wide ones only, everyone's, or nothing (a key no user has, without the shared)."""

from __future__ import annotations

import uuid

from memories.scope import AGENT_WIDE, ReadScope

DANA = uuid.UUID("55555555-5555-4555-8555-555555555555")


def test_each_scope_is_its_condition() -> None:
    assert AGENT_WIDE.condition() == ("user_id IS NULL", [])
    assert ReadScope(user_id=DANA, named=True).condition("m.user_id") == (
        "(m.user_id = %s OR m.user_id IS NULL)",
        [str(DANA)],
    )
    assert ReadScope(user_id=DANA, include_shared=False, named=True).condition() == (
        "user_id = %s",
        [str(DANA)],
    )
    assert ReadScope(all_users=True).condition() == ("true", [])


def test_a_user_with_no_row_reads_the_shared_ones_or_nothing() -> None:
    unknown = ReadScope(user_id=None, named=True)
    assert unknown.condition() == ("user_id IS NULL", []) and not unknown.empty
    alone = ReadScope(user_id=None, include_shared=False, named=True)
    assert alone.condition() == ("false", []) and alone.empty


def test_without_a_user_include_shared_false_still_reads_the_agent_wide_ones() -> None:
    # Without a user there is no "own" part to keep: the read is the agent-wide one.
    assert ReadScope(include_shared=False).condition() == ("user_id IS NULL", [])
