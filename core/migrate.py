"""Plain numbered SQL migrations, applied in order, each in its own transaction.

Applied files are recorded in ``public.ibex_schema_migrations`` with a checksum; running again
applies nothing, and an applied file that was edited afterwards is refused. An advisory lock
keeps two ``release`` processes from applying the same file at once.

:func:`check_schema` is the one check every command that needs the database (and ``/readyz``)
runs first: an unreachable, unmigrated or not fully migrated database is reported as a
:class:`~core.errors.SchemaNotReadyError` whose message is one line saying what to do.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import psycopg2

from core.db import connect_params
from core.errors import (
    ConfigError,
    DatabaseUnreachableError,
    MigrationsPendingError,
    SchemaMissingError,
)

_NAME = re.compile(r"^(\d{6})_[a-z0-9_]+\.sql$")
_LOCK_KEY = 0x1BE7_0001

HISTORY_DDL = """
CREATE TABLE IF NOT EXISTS public.ibex_schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    checksum    text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)
"""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def load_migrations(folder: Path | None = None) -> list[Migration]:
    """The migration files in version order (default: the packaged ``migrations`` folder).

    Only files named as migrations are read: the folder is also a package, so it holds its
    ``__init__.py`` and, once Python has imported it with bytecode caching on (any install,
    or a checkout without ``PYTHONDONTWRITEBYTECODE``), a ``__pycache__`` folder."""
    root = resources.files("migrations") if folder is None else folder
    found = []
    for entry in root.iterdir():
        match = _NAME.match(entry.name)
        if match and entry.is_file():
            text = entry.read_text(encoding="utf-8")
            found.append(Migration(int(match.group(1)), entry.name, text))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise ConfigError("two migration files share a version number")
    return found


def migrate(url: str, folder: Path | None = None) -> list[str]:
    """Apply every pending migration to the database at ``url``; return the names applied."""
    migrations = load_migrations(folder)
    conn = connect(url)
    applied_now: list[str] = []
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
            cur.execute(HISTORY_DDL)
            cur.execute("SELECT version, checksum FROM public.ibex_schema_migrations")
            applied = dict(cur.fetchall())
        conn.autocommit = False
        for migration in migrations:
            if migration.version in applied:
                if applied[migration.version] != migration.checksum:
                    raise ConfigError(
                        f"migration {migration.name} was changed after it was applied"
                    )
                continue
            with conn, conn.cursor() as cur:
                cur.execute(migration.sql)
                cur.execute(
                    "INSERT INTO public.ibex_schema_migrations (version, name, checksum)"
                    " VALUES (%s, %s, %s)",
                    (migration.version, migration.name, migration.checksum),
                )
            applied_now.append(migration.name)
    finally:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
        conn.close()
    return applied_now


MIGRATE_HINT = "run `ibex migrate`"

_HISTORY_EXISTS_SQL = "SELECT to_regclass('public.ibex_schema_migrations') IS NOT NULL"
_APPLIED_SQL = "SELECT version FROM public.ibex_schema_migrations"


def describe_target(url: str) -> str:
    """``host:port/database`` of a database URL: where, without the credentials."""
    params = connect_params(url)
    return f"{params['host']}:{params['port']}/{params['database']}"


def connect(url: str) -> psycopg2.extensions.connection:
    """A psycopg2 connection to ``url``; failing to connect is a
    :class:`~core.errors.DatabaseUnreachableError` with a one-line message."""
    params = connect_params(url)
    params.setdefault("connect_timeout", 5)
    params.setdefault("application_name", "ibex")
    try:
        return psycopg2.connect(**params)
    except psycopg2.Error as exc:
        target = describe_target(url)
        raise DatabaseUnreachableError(
            f"cannot connect to the database at {target}: {first_line(exc)};"
            f" check DATABASE_URL and that Postgres is running, then {MIGRATE_HINT}",
            target=target,
        ) from exc


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (psycopg2's run to several)."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__


@functools.lru_cache(maxsize=1)
def _shipped() -> tuple[tuple[int, str], ...]:
    return tuple((m.version, m.name) for m in load_migrations())


def verify_schema(
    query: Callable[[str], Sequence[tuple[object, ...]]],
    *,
    target: str = "the database",
    migrations: Sequence[Migration] | None = None,
) -> None:
    """Raise :class:`~core.errors.SchemaMissingError` or
    :class:`~core.errors.MigrationsPendingError` unless every shipped migration is applied.
    ``query(sql)`` runs one statement and returns its rows: on a psycopg2 cursor or a peewee
    database alike."""
    shipped = _shipped() if migrations is None else tuple((m.version, m.name) for m in migrations)
    if not query(_HISTORY_EXISTS_SQL)[0][0]:
        raise SchemaMissingError(
            f"the database at {target} has no IBEX schema (never migrated): {MIGRATE_HINT}"
        )
    applied = {int(str(r[0])) for r in query(_APPLIED_SQL)}
    pending = [name for version, name in shipped if version not in applied]
    if pending:
        raise MigrationsPendingError(
            f"the database at {target} is missing {len(pending)} of {len(shipped)}"
            f" migrations ({', '.join(pending)}): {MIGRATE_HINT}",
            pending=pending,
            applied=len(applied),
        )


def check_schema(url: str) -> None:
    """Connect to ``url`` and check that every shipped migration is applied; raise a
    :class:`~core.errors.SchemaNotReadyError` (one line, what to do) otherwise."""
    conn = connect(url)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:

            def query(sql: str) -> list[tuple[object, ...]]:
                cur.execute(sql)
                return list(cur.fetchall())

            verify_schema(query, target=describe_target(url))
    except psycopg2.Error as exc:
        target = describe_target(url)
        raise DatabaseUnreachableError(
            f"the database at {target} failed a query: {first_line(exc)}", target=target
        ) from exc
    finally:
        conn.close()
