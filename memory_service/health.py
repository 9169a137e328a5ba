"""``GET /healthz`` (the process answers) and ``GET /readyz`` (Postgres with a current schema,
and Redis, answer)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import falcon
import redis

from core.db import db_errors
from core.errors import SchemaNotReadyError
from core.migrate import verify_schema
from memory_service.errors import dumps
from memory_service.memories.store import MemoryStore


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
    ) -> None:
        self.store = store
        self.redis = redis_client
        self.search_mode = search_mode

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
                with db_errors():
                    verify_schema(lambda sql: self.store.db.execute_sql(sql).fetchall())
                checks["schema"] = "ok"
            except Exception as exc:
                checks["schema"] = f"error: {type(exc).__name__}"
                if isinstance(exc, SchemaNotReadyError):
                    details["schema"] = str(exc)
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
