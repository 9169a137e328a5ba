"""Migrations build the schema from nothing, and running them again changes nothing."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg2
import pytest

from core.db import connect_params
from core.errors import ConfigError
from core.migrate import load_migrations, migrate
from tests.servers import RunPostgres

SNAPSHOT_QUERIES = (
    "SELECT table_schema, table_name, column_name, data_type, is_nullable, column_default"
    " FROM information_schema.columns WHERE table_schema LIKE 'ibex%%' ORDER BY 1, 2, 3",
    "SELECT schemaname, tablename, indexname, indexdef FROM pg_indexes"
    " WHERE schemaname LIKE 'ibex%%' ORDER BY 1, 2, 3",
    "SELECT schemaname, tablename, policyname, roles::text, qual, with_check FROM pg_policies"
    " ORDER BY 1, 2, 3",
    "SELECT event_object_table, trigger_name, action_timing, event_manipulation"
    " FROM information_schema.triggers WHERE trigger_schema LIKE 'ibex%%' ORDER BY 1, 2, 4",
    "SELECT relname, relrowsecurity, relforcerowsecurity FROM pg_class c"
    " JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname LIKE 'ibex%%' AND c.relkind IN ('r', 'p') ORDER BY 1",
    "SELECT version, name, checksum FROM public.ibex_schema_migrations ORDER BY 1",
)


def _snapshot(url: str) -> list[list[tuple]]:
    conn = psycopg2.connect(**connect_params(url))
    try:
        with conn.cursor() as cur:
            out = []
            for query in SNAPSHOT_QUERIES:
                cur.execute(query)
                out.append(cur.fetchall())
            return out
    finally:
        conn.close()


@pytest.fixture
def empty_database(postgres_server: RunPostgres):
    """A brand-new empty database of this run, dropped afterwards."""
    url = postgres_server.create(f"mig_{uuid.uuid4().hex[:8]}")
    yield url
    postgres_server.drop(url)


def test_migrations_apply_to_empty_database_then_change_nothing(empty_database: str) -> None:
    applied = migrate(empty_database)
    assert applied == [m.name for m in load_migrations()]
    first = _snapshot(empty_database)
    tables = {(row[0], row[1]) for row in first[0]}
    for expected in [
        ("ibex_core", "orgs"),
        ("ibex_core", "agents"),
        ("ibex_core", "directives"),
        ("ibex_core", "directive_versions"),
        ("ibex_core", "sessions"),
        ("ibex_core", "checkpoints"),
        ("ibex_core", "checkpoint_payloads"),
        ("ibex_core", "extraction_turns"),
        ("ibex_core", "extraction_slots"),
        ("ibex_core", "dead_letters"),
        ("ibex_memory", "memories"),
        ("ibex_memory", "api_tokens"),
    ]:
        assert expected in tables

    assert migrate(empty_database) == []
    assert _snapshot(empty_database) == first


def test_every_tenant_table_enables_and_forces_rls(empty_database: str) -> None:
    migrate(empty_database)
    rls = {name: (enabled, forced) for name, enabled, forced in _snapshot(empty_database)[4]}
    for table in [
        "agents",
        "directives",
        "directive_versions",
        "sessions",
        "checkpoints",
        "checkpoint_payloads",
        "extraction_turns",
        "extraction_slots",
        "memories",
        "memory_embeddings",
        "turn_usage",
    ]:
        assert rls[table] == (True, True), table
    # Budgets: enabled, not forced (the owner's `ibex budget` writes any org's row).
    assert rls["org_budgets"] == (True, False)
    policies = _snapshot(empty_database)[2]
    tenant_policies = [p for p in policies if p[2] == "tenant_isolation"]
    assert len(tenant_policies) == 13
    assert all("rls_org_visible(org_id)" in p[4] for p in tenant_policies)


def test_an_applied_migration_that_was_edited_is_refused(
    empty_database: str, tmp_path: Path
) -> None:
    folder = tmp_path / "migrations"
    folder.mkdir()
    (folder / "000001_one.sql").write_text("CREATE TABLE public.t_one (id int);")
    assert migrate(empty_database, folder) == ["000001_one.sql"]
    (folder / "000001_one.sql").write_text("CREATE TABLE public.t_one (id bigint);")
    with pytest.raises(ConfigError, match="changed after it was applied"):
        migrate(empty_database, folder)


def test_a_failing_migration_leaves_nothing_behind(empty_database: str, tmp_path: Path) -> None:
    folder = tmp_path / "migrations"
    folder.mkdir()
    (folder / "000001_ok.sql").write_text("CREATE TABLE public.t_ok (id int);")
    (folder / "000002_bad.sql").write_text(
        "CREATE TABLE public.t_half (id int); SELECT no_such_function();"
    )
    with pytest.raises(psycopg2.Error):
        migrate(empty_database, folder)
    conn = psycopg2.connect(**connect_params(empty_database))
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass('public.t_ok'), to_regclass('public.t_half')")
        assert cur.fetchone() == ("t_ok", None)
        cur.execute("SELECT version FROM public.ibex_schema_migrations")
        assert cur.fetchall() == [(1,)]
    conn.close()
