"""Database handles, tenant transactions and the one place peewee errors are translated.

Row-level security is switched on per transaction: :func:`tenant` runs ``SET LOCAL ROLE
ibex_app`` and sets ``ibex.org_id`` for that transaction only, so a tenant query sees its own
org and nothing else, even when ``DATABASE_URL`` names a superuser. The only cross-org read,
the extraction scan, runs under :func:`scan_scope` as ``ibex_scan``, which may read the identity
columns of sessions and nothing more.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import unquote, urlparse

import peewee
import psycopg2.extensions
import psycopg2.extras
from playhouse.postgres_ext import PooledPostgresqlExtDatabase, PostgresqlExtDatabase

from core import fastjson
from core.errors import ConfigError, DatabaseUnavailableError

T = TypeVar("T")

# json and jsonb values are read by orjson, with json's answers (core.fastjson): a turn's
# stored result, which a write served by another process reads back, holds its vectors.
psycopg2.extras.register_default_json(globally=True, loads=fastjson.loads)
psycopg2.extras.register_default_jsonb(globally=True, loads=fastjson.loads)

APP_ROLE = "ibex_app"
SCAN_ROLE = "ibex_scan"


def connect_params(url: str) -> dict[str, object]:
    """psycopg2 keyword arguments for a ``postgresql://`` URL."""
    parsed = urlparse(url)
    if parsed.scheme not in ("postgres", "postgresql"):
        raise ConfigError("DATABASE_URL must be a postgresql:// URL", variable="DATABASE_URL")
    params: dict[str, object] = {
        "database": unquote(parsed.path.lstrip("/")) or "postgres",
        "host": parsed.hostname or "127.0.0.1",
        "port": parsed.port or 5432,
    }
    if parsed.username:
        params["user"] = unquote(parsed.username)
    if parsed.password:
        params["password"] = unquote(parsed.password)
    for part in filter(None, parsed.query.split("&")):
        key, _, value = part.partition("=")
        params[key] = unquote(value)
    return params


def make_database(url: str | None, **options: object) -> PostgresqlExtDatabase:
    """An unconnected peewee database for ``url``; connects on first use, one per thread."""
    if not url:
        raise ConfigError(
            "DATABASE_URL is not set: the session store is required", variable="DATABASE_URL"
        )
    params = connect_params(url)
    params.setdefault("application_name", "ibex")
    params.setdefault("connect_timeout", 5)
    params.update(options)
    name = params.pop("database")
    return PostgresqlExtDatabase(name, register_hstore=False, **params)


class QuietPool(PooledPostgresqlExtDatabase):  # type: ignore[misc]  # peewee has no types
    """A connection pool without peewee's ``SELECT 1`` probe at every checkout (a round trip
    made while holding the pool lock). Only a connection psycopg2 already knows to be broken is
    discarded at checkout; one that died silently (a server restart, a failover, a terminated
    backend) fails the ``BEGIN`` of its next transaction, and :func:`transaction` then replaces
    it and begins again on a fresh one, so the caller never sees it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Called first by :meth:`close_all`: a thread that works with the pool in the
        #: background (the memory service's vectors) finishes before the connections close.
        self.before_close_all: list[Callable[[], object]] = []

    def close_all(self) -> None:
        for hook in list(self.before_close_all):
            hook()
        super().close_all()

    def _is_closed(self, conn: Any) -> bool:
        return bool(conn.closed) or (
            conn.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_UNKNOWN
        )


def make_pool(
    url: str | None,
    *,
    max_connections: int,
    application_name: str,
    wait_seconds: float = 30,
) -> QuietPool:
    """A pooled database for ``url``: a unit of work borrows a connection and gives it back."""
    if not url:
        raise ConfigError(
            "DATABASE_URL is not set: the session store is required", variable="DATABASE_URL"
        )
    params = connect_params(url)
    params.setdefault("application_name", application_name)
    params.setdefault("connect_timeout", 5)
    name = params.pop("database")
    return QuietPool(
        name,
        max_connections=max_connections,
        timeout=wait_seconds,
        stale_timeout=300,
        register_hstore=False,
        **params,
    )


def uuid_column(value: Any) -> uuid.UUID:
    """A uuid column's value as a UUID: already one when psycopg2's uuid caster is registered
    (peewee does), else parsed from its text."""
    return value if type(value) is uuid.UUID else uuid.UUID(str(value))


def _as_uuid(value: uuid.UUID | str) -> str:
    return str(value if isinstance(value, uuid.UUID) else uuid.UUID(str(value)))


#: How many times a transaction is begun on a fresh connection when the one it got is dead.
#: A restart or failover ends every pooled backend at once; the first failure drops the idle
#: ones too, so a second attempt normally suffices.
BEGIN_ATTEMPTS = 3


#: The statements each connection has prepared, by name (a connection that is closed and
#: dropped is forgotten with it): ``PREPARE`` is per connection, and a second one of the same
#: name fails.
_PREPARED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
_PREPARED_LOCK = threading.Lock()


def is_prepared(connection: Any, name: str) -> bool:
    """Whether ``connection`` holds the prepared statement ``name`` (:func:`mark_prepared`)."""
    return name in _PREPARED.get(connection, ())


def mark_prepared(connection: Any, name: str) -> None:
    """Remember that ``connection`` holds the prepared statement ``name``."""
    with _PREPARED_LOCK:
        _PREPARED.setdefault(connection, set()).add(name)


def connection_lost(db: peewee.Database) -> bool:
    """Whether this thread's connection is one psycopg2 has found broken (its server is gone)."""
    if db.is_closed():
        return False
    return bool(db.connection().closed)


def replace_broken_connection(db: peewee.Database) -> None:
    """Drop this thread's broken connection so the next statement opens a fresh one. In a pool,
    the idle connections go too: whatever ended this one (a restart, a failover) ended them."""
    with contextlib.suppress(peewee.PeeweeException, psycopg2.Error):
        db.close()
    close_idle = getattr(db, "close_idle", None)
    if callable(close_idle):
        with contextlib.suppress(peewee.PeeweeException, psycopg2.Error):
            close_idle()


@contextlib.contextmanager
def transaction(db: peewee.Database) -> Iterator[None]:
    """``db.atomic()`` that survives a dead connection: the ``BEGIN`` is the first round trip
    of a transaction, so when it fails on a connection psycopg2 then marks broken nothing of
    the transaction has run, and it is begun again on a fresh connection (at most
    :data:`BEGIN_ATTEMPTS` times). A server that is still down, or a connection lost after the
    ``BEGIN``, raises :class:`DatabaseUnavailableError` (the transaction rolled back)."""
    with db_errors():
        if db.in_transaction():
            with db.atomic():  # a savepoint: the enclosing transaction owns the connection
                yield
            return
        txn = _on_a_live_connection(db, lambda: _entered(db.atomic()))
        try:
            yield
        except BaseException:
            txn.__exit__(*sys.exc_info())
            raise
        txn.__exit__(None, None, None)


def one_statement(db: peewee.Database, sql: str, params: Any = ()) -> Any:
    """Run ``sql`` as one statement in its own implicit transaction (in the caller's when there
    is one) and return its cursor: for the server-side functions that set the tenant role and
    org themselves, one round trip instead of a transaction's four.

    A dead pooled connection is handled as :func:`transaction` handles it: when the statement
    fails on a connection psycopg2 then marks broken, it is sent again on a fresh one (at most
    :data:`BEGIN_ATTEMPTS` times; only outside a transaction, and only statements that are safe
    to run again, since the answer of a committed one may be what was lost). A server that is
    still down, or any other connection failure, raises :class:`DatabaseUnavailableError`."""
    with db_errors():
        if db.in_transaction():
            return db.execute_sql(sql, params)
        return _on_a_live_connection(db, lambda: db.execute_sql(sql, params))


def _entered(txn: Any) -> Any:
    txn.__enter__()
    return txn


def _on_a_live_connection(db: peewee.Database, first_round_trip: Callable[[], T]) -> T:
    """``first_round_trip()``, run again on a fresh connection when it failed on a connection
    psycopg2 then marks broken (at most :data:`BEGIN_ATTEMPTS` times in all)."""
    attempt = 0
    while True:
        attempt += 1
        try:
            return first_round_trip()
        except (peewee.OperationalError, peewee.InterfaceError):
            if attempt >= BEGIN_ATTEMPTS or not connection_lost(db):
                raise
            replace_broken_connection(db)


@contextlib.contextmanager
def tenant(db: peewee.Database, org_id: uuid.UUID | str) -> Iterator[None]:
    """One transaction as the tenant role with ``org_id`` set: row-level security applies."""
    with transaction(db):
        enter_tenant(db, org_id)
        yield


def enter_tenant(db: peewee.Database, org_id: uuid.UUID | str) -> None:
    """Switch the current transaction to the tenant role with ``org_id`` set (one round trip)."""
    db.execute_sql(
        f"SET LOCAL ROLE {APP_ROLE}; SELECT set_config('ibex.org_id', %s, true)",
        (_as_uuid(org_id),),
    )


@contextlib.contextmanager
def scan_scope(db: peewee.Database) -> Iterator[None]:
    """One transaction as the scan role: session identities across orgs, nothing else."""
    with transaction(db):
        db.execute_sql(f"SET LOCAL ROLE {SCAN_ROLE}")
        yield


@contextlib.contextmanager
def db_errors() -> Iterator[None]:
    """Translate connection-level peewee errors into :class:`DatabaseUnavailableError`."""
    try:
        yield
    except (peewee.OperationalError, peewee.InterfaceError) as exc:
        raise DatabaseUnavailableError(f"database unavailable: {exc}".strip()) from exc


def is_unique_violation(exc: BaseException, constraint: str | None = None) -> bool:
    """Whether ``exc`` is a unique violation (optionally of the named constraint or index)."""
    orig = getattr(exc, "orig", None) or exc.__cause__ or exc
    if getattr(orig, "pgcode", None) != "23505":
        return False
    if constraint is None:
        return True
    diag = getattr(orig, "diag", None)
    return getattr(diag, "constraint_name", None) == constraint


OPS_ROLE = "ibex_ops"


@contextlib.contextmanager
def operator_scope(db: peewee.Database) -> Iterator[None]:
    """One read-only transaction across every org, for operator commands (status, dlq)."""
    with transaction(db):
        db.execute_sql(f"SET LOCAL ROLE {OPS_ROLE}")
        yield


def require_bypass_rls(db: peewee.Database) -> None:
    """Refuse a cross-org delete by a role that row-level security would show no rows: the
    delete would silently do nothing. Pruning and erasure run as the role that migrates."""
    allowed = db.execute_sql(
        "SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user"
    ).fetchone()
    if not (allowed and allowed[0]):
        raise ConfigError(
            "pruning needs the role that runs `ibex migrate` (a superuser or a role with"
            " BYPASSRLS) in DATABASE_URL",
            variable="DATABASE_URL",
        )
