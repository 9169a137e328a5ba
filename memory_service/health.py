"""``GET /healthz`` (the process answers) and ``GET /readyz`` (Postgres with a current schema,
and Redis, answer), and :class:`SchemaGate`, which holds the API's routes while the schema is
not current: they answer 503 ``SCHEMA_NOT_READY`` with the ``ibex migrate`` hint (mapped in
:mod:`memory_service.errors`), not a 500 from the first query that finds no table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import falcon
import peewee
import redis

from core.db import db_errors
from core.errors import SchemaNotReadyError
from core.migrate import verify_schema
from memories.store import MemoryStore
from schema.bodies import dumps


def describe_database(db: peewee.Database) -> str:
    """``host:port/database`` of a peewee database, as ``ibex migrate`` names it."""
    params = getattr(db, "connect_params", {}) or {}
    host = params.get("host") or "localhost"
    port = params.get("port") or 5432
    return f"{host}:{port}/{db.database}"


def check_schema_current(db: peewee.Database) -> None:
    """Raise :class:`~core.errors.SchemaNotReadyError` (one line naming the database and what
    to do) unless every shipped migration is applied; a database that does not answer is a
    :class:`~core.errors.DatabaseUnavailableError`."""
    with db_errors():
        verify_schema(lambda sql: db.execute_sql(sql).fetchall(), target=describe_database(db))


class SchemaGate:
    """Falcon middleware: requests under :data:`PREFIX` are refused with
    :class:`~core.errors.SchemaNotReadyError` until the schema is current. Checked on every
    such request until it is current once; after that never again (a schema does not go back),
    so a serving process pays nothing."""

    PREFIX = "/v1/"

    def __init__(self, db: peewee.Database) -> None:
        self.db = db
        self.current = False

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if self.current or not req.path.startswith(self.PREFIX):
            return
        check_schema_current(self.db)
        self.current = True


class HealthResource:
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = falcon.MEDIA_JSON
        resp.data = dumps({"status": "ok"})


class ReadyResource:
    def __init__(
        self,
        store: MemoryStore,
        redis_client: redis.Redis,
        search_mode: Callable[[], str] | None = None,
        embeddings_check: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.redis = redis_client
        self.search_mode = search_mode
        #: Raises when the embedder's dimension differs from its model's stored vectors.
        self.embeddings_check = embeddings_check

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        checks: dict[str, str] = {}
        details: dict[str, str] = {}
        try:
            self.store.ping()
            checks["postgres"] = "ok"
        except Exception as exc:
            checks["postgres"] = f"error: {type(exc).__name__}"
        else:
            # Not ready until the schema is current: before `ibex migrate`, every request would
            # answer 500.
            try:
                check_schema_current(self.store.db)
                checks["schema"] = "ok"
            except Exception as exc:
                checks["schema"] = f"error: {type(exc).__name__}"
                if isinstance(exc, SchemaNotReadyError):
                    details["schema"] = str(exc)
            if self.embeddings_check is not None and checks["schema"] == "ok":
                try:
                    self.embeddings_check()
                    checks["embeddings"] = "ok"
                except Exception as exc:
                    checks["embeddings"] = f"error: {type(exc).__name__}"
                    details["embeddings"] = str(exc)
        try:
            self.redis.ping()
            checks["redis"] = "ok"
        except Exception as exc:
            checks["redis"] = f"error: {type(exc).__name__}"
        ready = all(v == "ok" for v in checks.values())
        if self.search_mode is not None and checks.get("schema") == "ok":
            try:
                details["search"] = self.search_mode()
            except Exception as exc:
                details["search"] = f"error: {type(exc).__name__}"
        body: dict[str, Any] = {"status": "ok" if ready else "unavailable", "checks": checks}
        if details:
            body["details"] = details
        resp.status = 200 if ready else 503
        resp.content_type = falcon.MEDIA_JSON
        resp.data = dumps(body)
