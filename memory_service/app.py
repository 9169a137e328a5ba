"""``create_app(settings)``: the memory service as a Falcon WSGI app. No import-time state.

One folder per domain (:mod:`.memories`, :mod:`.sessions`, :mod:`.search`, :mod:`.tokens`,
:mod:`.users`),
each with its resources (``endpoints``), its flows (``service``) and its SQL (``store``); the
helpers every resource shares in :mod:`.http`, the refusals mapped onto HTTP once in
:mod:`.errors`, idempotency records in :mod:`.idempotency`, ``/healthz`` and ``/readyz`` in
:mod:`.health`, the OpenAPI document in :mod:`.openapi`, ``GET /metrics`` in :mod:`.metrics`.

Database connections come from a small pool and go back to it after each request, so a process
holds at most one connection per thread that is serving a request, whatever the thread count.
"""

from __future__ import annotations

import logging
from typing import Any, Literal, cast

import falcon
import peewee
import redis
from playhouse.pool import MaxConnectionsExceeded, PooledDatabase
from playhouse.postgres_ext import PostgresqlExtDatabase
from redis.backoff import NoBackoff
from redis.retry import Retry

from core import tracing
from core.config import Settings
from core.db import make_pool as db_pool
from core.errors import DatabaseUnavailableError
from core.prices import PriceTable
from embeddings import Embedder, QueryCache, embedder_from_settings
from extraction.budgets import BudgetStore
from extraction.usage import UsageReader
from memories.auth import Authenticator
from memories.idempotency import IdempotencyStore
from memories.pending_vectors import PendingVectors
from memories.search.service import SearchService
from memories.search.store import SearchStore
from memories.service import MemoryService
from memories.store import MemoryStore
from memories.tokens import TokenStore
from memories.users import UserService
from memories.vectors import EmbeddingStore
from memory_service import console, docs_page, errors
from memory_service.agents import AgentResource
from memory_service.health import HealthResource, ReadyResource, SchemaGate
from memory_service.http import Api
from memory_service.memories.endpoints import (
    MemoriesResource,
    MemoryHistoryResource,
    MemoryResource,
)
from memory_service.metrics import Metrics, MetricsResource, RequestMetrics
from memory_service.openapi.document import build_spec
from memory_service.openapi.endpoints import OpenApiResource
from memory_service.search.endpoints import ContextResource, SearchResource
from memory_service.sessions.endpoints import add_routes as add_session_routes
from memory_service.usage.endpoints import add_routes as add_usage_routes
from memory_service.users.endpoints import UserResource
from sessions.agents import AgentResolver
from sessions.store import SessionStore
from sessions.users import UserStore

log = logging.getLogger(__name__)

POOL_MAX_CONNECTIONS = 32
POOL_WAIT_SECONDS = 10
REDIS_TIMEOUT_SECONDS = 2.0


def make_web_pool(
    url: str | None, *, max_connections: int = POOL_MAX_CONNECTIONS
) -> peewee.Database:
    """A pooled peewee database for ``url``: a request borrows one connection and returns it."""
    return db_pool(
        url,
        max_connections=max_connections,
        application_name="ibex-memory",
        wait_seconds=POOL_WAIT_SECONDS,
    )


def make_redis(url: str) -> redis.Redis:
    """A Redis client that fails fast: one immediate retry (for a stale pooled connection),
    short timeouts. A slow Redis must not hold requests: idempotency then falls back on the
    Postgres keys (see :mod:`memories.idempotency`)."""
    return redis.Redis.from_url(
        url,
        socket_timeout=REDIS_TIMEOUT_SECONDS,
        socket_connect_timeout=REDIS_TIMEOUT_SECONDS,
        retry=Retry(NoBackoff(), 1),
        health_check_interval=30,
    )


class ReturnConnection:
    """Falcon middleware: hand a pooled connection back once the response is decided."""

    def __init__(self, db: peewee.Database) -> None:
        self.db = db
        self.pooled = isinstance(db, PooledDatabase)

    def process_response(
        self, req: falcon.Request, resp: falcon.Response, resource: Any, req_succeeded: bool
    ) -> None:
        if not self.pooled or self.db.is_closed():
            return
        try:
            self.db.close()
        except peewee.PeeweeException:
            log.exception("could not return a database connection to the pool")


def create_app(
    settings: Settings,
    *,
    db: peewee.Database | None = None,
    redis_client: redis.Redis | None = None,
    token_cache_seconds: float = 2.0,
    embedder: Embedder | Literal["settings"] | None = "settings",
) -> falcon.App[falcon.Request, falcon.Response]:
    """The WSGI app. ``db``, ``redis_client`` and ``embedder`` default to ones built from
    ``settings`` (``EMBEDDINGS_PROVIDER``; None: lexical search only). A configured dimension
    that differs from the stored vectors of the same model is a ConfigError here."""
    if embedder == "settings":
        embedder = embedder_from_settings(settings)
    if db is None:
        db = make_web_pool(settings.database_url)
    embeddings = EmbeddingStore(db)
    if redis_client is None:
        redis_client = make_redis(settings.idempotency_redis_url or settings.redis_url)
    store = MemoryStore(db, settings.memory_near_duplicate_threshold)
    metrics = Metrics(settings.prometheus_multiproc_dir)
    idempotency = IdempotencyStore(
        redis_client,
        ttl_seconds=settings.idempotency_ttl_seconds,
        lease_seconds=settings.idempotency_lease_seconds,
    )
    api = Api(
        auth=Authenticator(TokenStore(db), cache_seconds=token_cache_seconds),
        max_body_bytes=settings.memory_max_body_bytes,
    )
    users = UserService(UserStore(db))
    pending = PendingVectors(embedder, embeddings, metrics) if embedder is not None else None
    memories = MemoryService(
        store,
        idempotency,
        metrics,
        users,
        embedder=embedder,
        embeddings=embeddings,
        session_user=SessionStore(cast(PostgresqlExtDatabase, db), bind_models=False).session_user,
        pending=pending,
    )
    try:
        # A model registered with another dimension is a ConfigError: refuse to start.
        memories.register_model()
    except DatabaseUnavailableError:
        # Registered on the first write that carries a vector (MemoryService), or by /readyz.
        log.warning("could not register the embedding model; /readyz will")
    # Metrics first: its process_response runs last, so it sees the final status and time.
    # The schema gate after ReturnConnection: the connection its check borrows goes back too.
    middleware: list[Any] = [RequestMetrics(metrics), ReturnConnection(db), SchemaGate(db)]
    if tracing.enabled():
        from memory_service.tracing import TraceRequests

        middleware.insert(0, TraceRequests())  # first in, last out: the span holds it all
    app = falcon.App(middleware=middleware)
    app.req_options.strip_url_path_trailing_slash = True
    errors.register(app)
    app.add_error_handler(MaxConnectionsExceeded, errors.handle_unavailable)
    app.add_error_handler(falcon.HTTPRouteNotFound, errors.handle_route_not_found)
    agents = AgentResolver(db)
    app.add_route("/v1/agents/{agent}", AgentResource(api, agents))
    app.add_route("/v1/memories", MemoriesResource(api, memories, users, agents))
    app.add_route("/v1/memories/{memory_id:uuid}", MemoryResource(api, memories, users))
    app.add_route(
        "/v1/memories/{memory_id:uuid}/history", MemoryHistoryResource(api, memories, users)
    )
    app.add_route("/healthz", HealthResource())
    searches = SearchStore(db)
    reads = SearchService(
        searches,
        QueryCache(embedder) if embedder is not None else None,
        metrics=metrics,
        pending=pending,
    )
    app.add_route("/v1/memories/search", SearchResource(api, reads, users, agents))
    app.add_route("/v1/context", ContextResource(api, reads, users, agents))
    prices = PriceTable.from_json(settings.llm_prices)
    add_session_routes(app, api, db, users, prices)
    add_usage_routes(app, api, UsageReader(db, prices), BudgetStore(db))
    app.add_route("/v1/users/{user}", UserResource(api, users))
    check = None
    if embedder is not None:
        model, dimension = embedder.model, embedder.dimension

        def check() -> None:
            embeddings.register(model, dimension)

    app.add_route("/readyz", ReadyResource(store, redis_client, reads.search_mode, check))
    spec = docs_page.document(
        build_spec(
            settings.memory_max_body_bytes,
            (embedder.model, embedder.dimension) if embedder is not None else None,
        )
    )
    app.add_route("/openapi.json", OpenApiResource(spec))
    app.add_route("/metrics", MetricsResource(metrics))
    docs_page.add_routes(app)
    # The console reads the broker's Redis (dead letters, queue depths).
    broker = make_redis(settings.redis_url) if settings.idempotency_redis_url else redis_client
    console.add_routes(
        app, settings, api=api, db=db, users=users, searches=reads, broker_redis=broker
    )
    return app
