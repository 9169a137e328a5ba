"""core.db.QuietPool.close_all lets the pool's background users finish first."""

from __future__ import annotations

import pytest
from playhouse.postgres_ext import PooledPostgresqlExtDatabase

from core.db import make_pool


def test_close_all_runs_the_hooks_before_it_closes_the_connections(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No connection is opened: the pool connects on first use.
    pool = make_pool(
        "postgresql://nobody@127.0.0.1:1/nothing", max_connections=2, application_name="t"
    )
    seen: list[str] = []
    pool.before_close_all.append(lambda: seen.append("hook"))
    monkeypatch.setattr(
        PooledPostgresqlExtDatabase, "close_all", lambda self: seen.append("closed")
    )
    pool.close_all()
    assert seen == ["hook", "closed"]
