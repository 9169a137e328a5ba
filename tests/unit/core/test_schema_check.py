"""The schema check's verdicts and the command line's translation of database errors, without
a database (the real ones are covered in tests/integration/operations)."""

from __future__ import annotations

from collections.abc import Sequence

import peewee
import psycopg2
import pytest

from cli import database_error_line
from core.errors import MigrationsPendingError, SchemaMissingError
from core.migrate import Migration, verify_schema

SHIPPED = [Migration(1, "000001_core.sql", "SELECT 1"), Migration(2, "000002_more.sql", "")]


def _database(history: list[int] | None):  # type: ignore[no-untyped-def]
    """A ``query`` over a database whose history table holds ``history`` (None: no table)."""

    def query(sql: str) -> Sequence[tuple[object, ...]]:
        if "to_regclass" in sql:
            return [(history is not None,)]
        assert history is not None, "the history table was read although it does not exist"
        return [(v,) for v in history]

    return query


def test_a_current_schema_passes() -> None:
    verify_schema(_database([1, 2]), migrations=SHIPPED)
    # A database ahead of this code (a newer release migrated it) is not refused.
    verify_schema(_database([1, 2, 3]), migrations=SHIPPED)


def test_a_database_never_migrated_says_run_migrate() -> None:
    with pytest.raises(SchemaMissingError) as info:
        verify_schema(_database(None), target="db:5432/x", migrations=SHIPPED)
    assert str(info.value) == (
        "the database at db:5432/x has no IBEX schema (never migrated): run `ibex migrate`"
    )


def test_pending_migrations_are_counted_and_named() -> None:
    with pytest.raises(MigrationsPendingError) as info:
        verify_schema(_database([1]), target="db:5432/x", migrations=SHIPPED)
    assert (info.value.pending, info.value.applied) == (["000002_more.sql"], 1)
    assert str(info.value) == (
        "the database at db:5432/x is missing 1 of 2 migrations (000002_more.sql):"
        " run `ibex migrate`"
    )
    with pytest.raises(MigrationsPendingError, match="missing 2 of 2"):
        verify_schema(_database([]), migrations=SHIPPED)


class _PgError(psycopg2.ProgrammingError):
    """psycopg2 errors get their pgcode from the server; this one is set by hand."""

    def __init__(self, message: str, pgcode: str) -> None:
        super().__init__(message)
        self._code = pgcode

    @property
    def pgcode(self) -> str:  # type: ignore[override]
        return self._code


def test_database_errors_escaping_a_command_become_one_line() -> None:
    undefined = _PgError('relation "ibex_core.orgs" does not exist\nLINE 1: SELECT ...', "42P01")
    wrapped = peewee.ProgrammingError(str(undefined))
    wrapped.__cause__ = undefined
    assert database_error_line(wrapped) == (
        'the database schema is not current (relation "ibex_core.orgs" does not exist):'
        " run `ibex migrate`"
    )
    lost = psycopg2.OperationalError("server closed the connection unexpectedly\n\tThis ...")
    line = database_error_line(lost)
    assert line is not None and line.startswith("database unavailable: server closed")
    assert "\n" not in line
    assert database_error_line(ValueError("not a database error")) is None
