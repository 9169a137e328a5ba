"""Settings from the environment: the only module that reads ``os.environ``.

Every process (web, worker, scheduler, the CLI) builds one frozen :class:`Settings` at start-up
and passes values on explicitly. A missing or malformed variable is a :class:`ConfigError`
naming the variable, raised before any work starts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from core.errors import ConfigError
from core.prices import parse_prices

#: Variables read by :meth:`Settings.from_env`, with their defaults (``None``: no default).
#: ``.env.example``, the README and the table of docs/configuration.md list the same variables,
#: with these defaults; a unit test keeps them in step.
DEFAULTS: dict[str, str | None] = {
    "DATABASE_URL": None,
    "REDIS_URL": "redis://127.0.0.1:6379/0",
    "IDEMPOTENCY_REDIS_URL": None,  # unset: REDIS_URL
    "MEMORY_SERVICE_URL": "http://127.0.0.1:8000",
    "MEMORY_SERVICE_TOKEN": None,
    "LLM_PROVIDER": None,  # "rules" when LLM_BASE_URL is unset, else "openai"
    "LLM_BASE_URL": None,
    "LLM_API_KEY": None,
    "LLM_MODEL": "gpt-4o-mini",
    "LLM_TIMEOUT_SECONDS": "60",
    "PORT": "8000",
    "EXTRACTION_LEASE_SECONDS": "300",
    "EXTRACTION_CLAIM_SECONDS": "120",
    "EXTRACTION_CONTEXT_TURNS": "3",
    "RETRY_MIN_BACKOFF_MS": "1000",
    "RETRY_MAX_BACKOFF_MS": "300000",
    "MAX_RETRIES": "20",
    "SCAN_BATCH_SIZE": "500",
    "SCAN_MAX_TURNS_PER_AGENT": "1000",
    "SCAN_INTERVAL_SECONDS": "60",
    "WORKER_PROCESSES": "2",
    "WORKER_THREADS": "8",
    "IDEMPOTENCY_TTL_SECONDS": "86400",
    "IDEMPOTENCY_LEASE_SECONDS": "30",
    "MEMORY_MAX_BODY_BYTES": "65536",
    "WEB_REQUEST_TIMEOUT_SECONDS": "10",
    "PROMETHEUS_MULTIPROC_DIR": None,  # unset: each web process serves its own metrics
    "HTTP_TIMEOUT_SECONDS": "30",
    "METRICS_PORT": None,  # unset: the worker exposes no metrics
    "SESSION_IDLE_SECONDS": "1800",
    "SESSION_IDLE_ACTION": "complete",
    "PRUNE_DONE_AFTER_DAYS": None,  # unset: the scheduler prunes nothing
    "PRUNE_DELETED_AFTER_DAYS": None,  # unset: the scheduler erases nothing
    # Facts that change: the related memories the extraction prompt lists, and the trigram
    # similarity at which the memory service refuses a near-duplicate (0: never).
    "EXTRACTION_RELATED_MEMORIES": "20",
    "MEMORY_NEAR_DUPLICATE_THRESHOLD": "0.9",
    "UPSTREAM_LLM_BASE_URL": None,  # the chat path's upstream; unset: the proxy refuses to start
    "UPSTREAM_LLM_API_KEY": None,  # unset: the caller's Authorization is passed on
    "UPSTREAM_TIMEOUT_SECONDS": "600",
    # Semantic search (embeddings): which embedder, and for "openai" where and which.
    "EMBEDDINGS_PROVIDER": "local",
    "EMBEDDINGS_BASE_URL": None,
    "EMBEDDINGS_MODEL": None,  # openai: required; local: the packaged model
    "EMBEDDINGS_API_KEY": None,
    "EMBEDDINGS_DIMENSION": None,  # openai: required; local: 256
    "EMBEDDINGS_TIMEOUT_SECONDS": "5",
    # Usage: prices per model over the default table (core/prices.py), JSON.
    "LLM_PRICES": None,
}

LLM_PROVIDERS = ("openai", "rules")
#: What the scheduler does with a session idle for SESSION_IDLE_SECONDS.
SESSION_IDLE_ACTIONS = ("complete", "abandon")
EMBEDDINGS_PROVIDERS = ("local", "openai", "none")
#: The widest vector stored (and accepted on ``POST /v1/memories``).
MAX_EMBEDDING_DIMENSION = 4096


def _redis_url(env: Mapping[str, str], name: str) -> str | None:
    url = _str(env, name)
    if url is not None and not url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(f"{name} must be a redis:// URL", variable=name)
    return url


def _fraction(env: Mapping[str, str], name: str) -> float:
    """A number in [0, 1]."""
    raw = _str(env, name) or DEFAULTS[name] or "0"
    message = f"{name} must be a number in [0, 1], got {raw!r}"
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(message, variable=name) from None
    if not 0 <= value <= 1:
        raise ConfigError(message, variable=name)
    return value


def _int(env: Mapping[str, str], name: str, minimum: int = 0) -> int:
    raw = env.get(name) or DEFAULTS[name]
    assert raw is not None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {raw!r}", variable=name) from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}", variable=name)
    return value


def _prices(env: Mapping[str, str]) -> str | None:
    """``LLM_PRICES`` as given, once it parses (a malformed table fails at start-up)."""
    raw = _str(env, "LLM_PRICES")
    parse_prices(raw)
    return raw


def _str(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    if value is None or value.strip() == "":
        return DEFAULTS[name]
    return value.strip()


def _embeddings(env: Mapping[str, str]) -> dict[str, Any]:
    """The EMBEDDINGS_* settings, checked together (``openai`` needs its URL, model and
    dimension; the others take none of them)."""
    provider = (_str(env, "EMBEDDINGS_PROVIDER") or "local").lower()
    if provider not in EMBEDDINGS_PROVIDERS:
        raise ConfigError(
            f"EMBEDDINGS_PROVIDER must be one of {', '.join(EMBEDDINGS_PROVIDERS)},"
            f" got {provider!r}",
            variable="EMBEDDINGS_PROVIDER",
        )
    base_url = _str(env, "EMBEDDINGS_BASE_URL")
    model = _str(env, "EMBEDDINGS_MODEL")
    dimension = _int(env, "EMBEDDINGS_DIMENSION", 1) if _str(env, "EMBEDDINGS_DIMENSION") else None
    if dimension is not None and dimension > MAX_EMBEDDING_DIMENSION:
        raise ConfigError(
            f"EMBEDDINGS_DIMENSION must be at most {MAX_EMBEDDING_DIMENSION}, got {dimension}",
            variable="EMBEDDINGS_DIMENSION",
        )
    if provider == "openai":
        for name, value in (
            ("EMBEDDINGS_BASE_URL", base_url),
            ("EMBEDDINGS_MODEL", model),
            ("EMBEDDINGS_DIMENSION", dimension),
        ):
            if value is None:
                raise ConfigError(f"EMBEDDINGS_PROVIDER=openai needs {name}", variable=name)
        assert base_url is not None
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(
                "EMBEDDINGS_BASE_URL must be an http(s):// URL", variable="EMBEDDINGS_BASE_URL"
            )
    return {
        "embeddings_provider": provider,
        "embeddings_base_url": base_url.rstrip("/") if base_url else None,
        "embeddings_model": model,
        "embeddings_api_key": _str(env, "EMBEDDINGS_API_KEY"),
        "embeddings_dimension": dimension,
        "embeddings_timeout_seconds": _int(env, "EMBEDDINGS_TIMEOUT_SECONDS", 1),
    }


@dataclass(frozen=True)
class Settings:
    """Configuration of one process. Build it with :meth:`from_env`."""

    database_url: str | None
    redis_url: str
    memory_service_url: str
    memory_service_token: str | None
    llm_provider: str
    llm_base_url: str | None
    llm_api_key: str | None
    llm_model: str
    llm_timeout_seconds: int
    port: int
    extraction_lease_seconds: int
    extraction_claim_seconds: int
    extraction_context_turns: int
    retry_min_backoff_ms: int
    retry_max_backoff_ms: int
    max_retries: int
    scan_batch_size: int
    scan_max_turns_per_agent: int
    scan_interval_seconds: int
    worker_processes: int
    worker_threads: int
    idempotency_ttl_seconds: int
    idempotency_lease_seconds: int
    memory_max_body_bytes: int
    web_request_timeout_seconds: int
    prometheus_multiproc_dir: str | None
    http_timeout_seconds: int
    metrics_port: int | None
    session_idle_seconds: int = 1800
    session_idle_action: str = "complete"
    #: The memory service's idempotency records: REDIS_URL unless set apart.
    idempotency_redis_url: str = ""
    #: The scheduler prunes the extraction state of turns done longer ago; None: never.
    prune_done_after_days: int | None = None
    #: The scheduler erases what was soft-deleted longer ago (sessions, memories, users);
    #: None: never.
    prune_deleted_after_days: int | None = None
    #: The scope's current memories listed in the extraction prompt (0: none).
    extraction_related_memories: int = 20
    #: pg_trgm similarity() at or above which a new memory is a near-duplicate of a current
    #: one of its scope (409 DUPLICATE_CONTENT); 0 turns the check off.
    memory_near_duplicate_threshold: float = 0.9
    #: The chat path (the ``proxy`` process): where chat completions are forwarded, the key
    #: used when the caller sends no ``Authorization``, and the upstream read timeout.
    upstream_llm_base_url: str | None = None
    upstream_llm_api_key: str | None = None
    upstream_timeout_seconds: int = 600
    #: Semantic search: ``local`` (the packaged offline model), ``openai`` (an
    #: OpenAI-compatible ``/v1/embeddings``) or ``none``; see :mod:`embeddings`.
    embeddings_provider: str = "none"
    embeddings_base_url: str | None = None
    embeddings_model: str | None = None
    embeddings_api_key: str | None = None
    embeddings_dimension: int | None = None
    embeddings_timeout_seconds: int = 5
    #: ``LLM_PRICES``: USD per million tokens per model, over the default table
    #: (:mod:`core.prices`); validated at start-up.
    llm_prices: str | None = None
    #: The variables that were set (non-empty) in the environment, defaults aside.
    explicit: frozenset[str] = frozenset()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        base_url = _str(env, "LLM_BASE_URL")
        provider = (_str(env, "LLM_PROVIDER") or ("openai" if base_url else "rules")).lower()
        if provider not in LLM_PROVIDERS:
            raise ConfigError(
                f"LLM_PROVIDER must be one of {', '.join(LLM_PROVIDERS)}, got {provider!r}",
                variable="LLM_PROVIDER",
            )
        if provider == "openai" and not base_url:
            raise ConfigError("LLM_PROVIDER=openai needs LLM_BASE_URL", variable="LLM_BASE_URL")
        idle_action = (_str(env, "SESSION_IDLE_ACTION") or "complete").lower()
        if idle_action not in SESSION_IDLE_ACTIONS:
            raise ConfigError(
                f"SESSION_IDLE_ACTION must be one of {', '.join(SESSION_IDLE_ACTIONS)},"
                f" got {idle_action!r}",
                variable="SESSION_IDLE_ACTION",
            )
        embeddings = _embeddings(env)
        database_url = _str(env, "DATABASE_URL")
        if database_url is not None and not database_url.startswith(
            ("postgres://", "postgresql://")
        ):
            raise ConfigError("DATABASE_URL must be a postgresql:// URL", variable="DATABASE_URL")
        redis_url = _redis_url(env, "REDIS_URL")
        assert redis_url is not None
        idempotency_redis_url = _redis_url(env, "IDEMPOTENCY_REDIS_URL") or redis_url
        settings = cls(
            database_url=database_url,
            redis_url=redis_url,
            memory_service_url=(_str(env, "MEMORY_SERVICE_URL") or "").rstrip("/"),
            memory_service_token=_str(env, "MEMORY_SERVICE_TOKEN"),
            llm_provider=provider,
            llm_base_url=base_url.rstrip("/") if base_url else None,
            llm_api_key=_str(env, "LLM_API_KEY"),
            llm_model=_str(env, "LLM_MODEL") or "gpt-4o-mini",
            llm_timeout_seconds=_int(env, "LLM_TIMEOUT_SECONDS", 1),
            port=_int(env, "PORT", 1),
            extraction_lease_seconds=_int(env, "EXTRACTION_LEASE_SECONDS", 1),
            extraction_claim_seconds=_int(env, "EXTRACTION_CLAIM_SECONDS", 1),
            extraction_context_turns=_int(env, "EXTRACTION_CONTEXT_TURNS", 0),
            extraction_related_memories=_int(env, "EXTRACTION_RELATED_MEMORIES", 0),
            memory_near_duplicate_threshold=_fraction(env, "MEMORY_NEAR_DUPLICATE_THRESHOLD"),
            retry_min_backoff_ms=_int(env, "RETRY_MIN_BACKOFF_MS", 1),
            retry_max_backoff_ms=_int(env, "RETRY_MAX_BACKOFF_MS", 1),
            max_retries=_int(env, "MAX_RETRIES", 0),
            scan_batch_size=_int(env, "SCAN_BATCH_SIZE", 1),
            scan_max_turns_per_agent=_int(env, "SCAN_MAX_TURNS_PER_AGENT", 1),
            scan_interval_seconds=_int(env, "SCAN_INTERVAL_SECONDS", 1),
            worker_processes=_int(env, "WORKER_PROCESSES", 1),
            worker_threads=_int(env, "WORKER_THREADS", 1),
            idempotency_ttl_seconds=_int(env, "IDEMPOTENCY_TTL_SECONDS", 1),
            idempotency_lease_seconds=_int(env, "IDEMPOTENCY_LEASE_SECONDS", 1),
            memory_max_body_bytes=_int(env, "MEMORY_MAX_BODY_BYTES", 1024),
            web_request_timeout_seconds=_int(env, "WEB_REQUEST_TIMEOUT_SECONDS", 1),
            prometheus_multiproc_dir=_str(env, "PROMETHEUS_MULTIPROC_DIR"),
            http_timeout_seconds=_int(env, "HTTP_TIMEOUT_SECONDS", 1),
            metrics_port=_int(env, "METRICS_PORT", 1) if _str(env, "METRICS_PORT") else None,
            session_idle_seconds=_int(env, "SESSION_IDLE_SECONDS", 1),
            session_idle_action=idle_action,
            idempotency_redis_url=idempotency_redis_url,
            prune_done_after_days=_int(env, "PRUNE_DONE_AFTER_DAYS", 1)
            if _str(env, "PRUNE_DONE_AFTER_DAYS")
            else None,
            prune_deleted_after_days=_int(env, "PRUNE_DELETED_AFTER_DAYS", 1)
            if _str(env, "PRUNE_DELETED_AFTER_DAYS")
            else None,
            upstream_llm_base_url=(_str(env, "UPSTREAM_LLM_BASE_URL") or "").rstrip("/") or None,
            upstream_llm_api_key=_str(env, "UPSTREAM_LLM_API_KEY"),
            upstream_timeout_seconds=_int(env, "UPSTREAM_TIMEOUT_SECONDS", 1),
            llm_prices=_prices(env),
            **embeddings,
            explicit=frozenset(name for name in DEFAULTS if (env.get(name) or "").strip()),
        )
        if settings.retry_max_backoff_ms < settings.retry_min_backoff_ms:
            raise ConfigError(
                "RETRY_MAX_BACKOFF_MS must not be below RETRY_MIN_BACKOFF_MS",
                variable="RETRY_MAX_BACKOFF_MS",
            )
        return settings

    def require_database_url(self) -> str:
        """The database URL, or a ConfigError: extraction without the session store is refused."""
        if not self.database_url:
            raise ConfigError(
                "DATABASE_URL is not set: the session store is required", variable="DATABASE_URL"
            )
        return self.database_url

    def redacted(self) -> dict[str, Any]:
        """Settings safe to log: secrets and URL passwords masked."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("memory_service_token", "llm_api_key", "embeddings_api_key") and value:
                value = "***"
            elif f.name.endswith("_url") and isinstance(value, str):
                value = redact_url(value)
            out[f.name] = value
        return out


def redact_url(url: str) -> str:
    """``scheme://user:secret@host`` → ``scheme://user:***@host``."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    creds, _, host = rest.rpartition("@")
    user, colon, _ = creds.partition(":")
    return f"{scheme}://{user}{':***' if colon else ''}@{host}"


def child_environment(overrides: Mapping[str, str]) -> dict[str, str]:
    """This process's environment with ``overrides``: what a spawned process should see."""
    env = dict(os.environ)
    env.update(overrides)
    return env


def export_environment(values: Mapping[str, str]) -> None:
    """Set variables in this process's environment, for libraries configured only that way
    (Dramatiq's Prometheus middleware reads its port and directory at import)."""
    os.environ.update(values)


def otel_environment() -> dict[str, str]:
    """The standard OpenTelemetry variables (``OTEL_*``) set in this process's environment:
    :mod:`core.tracing` decides from them whether traces are on."""
    return {key: value for key, value in os.environ.items() if key.startswith("OTEL_")}
