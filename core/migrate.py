"""Plain numbered SQL migrations, applied in order, each in its own transaction.

Applied files are recorded in ``public.ibex_schema_migrations`` with a checksum; running again
applies nothing, and an applied file that was edited afterwards is refused. An advisory lock
keeps two ``release`` processes from applying the same file at once.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import psycopg2

from core.db import connect_params
from core.errors import ConfigError

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
    """The migration files in version order (default: the packaged ``migrations`` folder)."""
    if folder is None:
        root = resources.files("migrations")
        entries = [(p.name, p.read_text(encoding="utf-8")) for p in root.iterdir()]
    else:
        entries = [(p.name, p.read_text(encoding="utf-8")) for p in folder.iterdir()]
    found = []
    for name, text in entries:
        match = _NAME.match(name)
        if match:
            found.append(Migration(int(match.group(1)), name, text))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise ConfigError("two migration files share a version number")
    return found


def migrate(url: str, folder: Path | None = None) -> list[str]:
    """Apply every pending migration to the database at ``url``; return the names applied."""
    migrations = load_migrations(folder)
    conn = psycopg2.connect(**connect_params(url))
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
