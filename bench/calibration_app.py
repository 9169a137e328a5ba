"""The calibration app of the memory service's POST benchmark: the least a keyed POST can do.

A WSGI app that answers every ``POST`` by parsing the JSON body, claiming the request's
``X-Idempotency-Key`` with one Redis ``SET NX``, inserting one row into a table of its own
(:data:`TABLE`, in the benchmark's database, never an ibex table) in one autocommit round
trip, storing the result under the key with one ``SET``, and answering 201 with a small JSON
body. No authentication, validation, fingerprint, metrics or logging: it is the floor the real
service is measured against (``python -m bench.memory_load --compare``), run under the same
gunicorn line (the Procfile's ``web`` command with this module in place of the service's), so
the server, worker class and load are the same and only the request's own work differs.

Configuration comes from ``DATABASE_URL`` and ``REDIS_URL``, as for the service; the table is
created by :func:`create_table` (the benchmark calls it before it starts the server).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

import psycopg2
import redis

SCHEMA = "ibex_bench_calibration"
TABLE = f"{SCHEMA}.posts"
KEY_PREFIX = "bench:calibration:"
KEY_SECONDS = 86_400

CREATE_SQL = f"""
CREATE SCHEMA IF NOT EXISTS {SCHEMA};
CREATE TABLE IF NOT EXISTS {TABLE} (
    id bigserial PRIMARY KEY,
    idempotency_key text NOT NULL UNIQUE,
    agent_id text NOT NULL,
    content text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
)
"""

INSERT_SQL = f"""
INSERT INTO {TABLE} (idempotency_key, agent_id, content) VALUES (%s, %s, %s)
RETURNING id, created_at
"""

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


def create_table(database_url: str) -> None:
    """The app's own schema and table in ``database_url`` (idempotent)."""
    conn = psycopg2.connect(database_url)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(CREATE_SQL)
    finally:
        conn.close()


class CalibrationApp:
    """One Postgres connection per thread (autocommit), one pooled Redis client."""

    def __init__(self, database_url: str, redis_url: str) -> None:
        self.database_url = database_url
        self.redis = redis.Redis.from_url(redis_url)
        self._local = threading.local()

    def _cursor(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            conn = self._local.conn = psycopg2.connect(self.database_url)
            conn.autocommit = True
        return conn.cursor()

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ["REQUEST_METHOD"] != "POST":
            return _answer(start_response, "200 OK", {"status": "ok"})
        length = int(environ.get("CONTENT_LENGTH") or 0)
        document = json.loads(environ["wsgi.input"].read(length))
        key = KEY_PREFIX + environ.get("HTTP_X_IDEMPOTENCY_KEY", "")
        if not self.redis.set(key, b"running", nx=True, ex=KEY_SECONDS):
            return _answer(start_response, "409 Conflict", {"error": "key in use"})
        with self._cursor() as cur:
            cur.execute(INSERT_SQL, (key, document["agent_id"], document["content"]))
            row_id, created_at = cur.fetchone()
        self.redis.set(key, str(row_id), ex=KEY_SECONDS)
        body = {"id": row_id, "content": document["content"], "created_at": created_at.isoformat()}
        return _answer(start_response, "201 Created", body)


def _answer(start_response: StartResponse, status: str, body: dict[str, Any]) -> list[bytes]:
    data = json.dumps(body).encode()
    start_response(
        status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
    )
    return [data]


def __getattr__(name: str) -> Any:
    """``application``, the gunicorn entry point (``bench.calibration_app:application``): built
    from the environment on first use, in each worker after the fork."""
    if name != "application":
        raise AttributeError(name)
    app = CalibrationApp(os.environ["DATABASE_URL"], os.environ["REDIS_URL"])
    globals()["application"] = app
    return app
