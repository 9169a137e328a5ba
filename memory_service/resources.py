"""The HTTP resources: /v1/memories, /v1/memories/{id}, health and the OpenAPI document.

``POST /v1/memories`` in order: authenticate, check the scope and the org, check the
idempotency key header, read at most the body limit, parse, validate (422 field by field), and
only then touch the key, because the fingerprint is taken over the validated body. So a request
that fails any of those steps never claims, and never consumes, its key.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import falcon
import redis
from marshmallow import Schema, ValidationError

from core.db import db_errors
from core.errors import SchemaNotReadyError
from core.migrate import verify_schema
from memory_service.auth import (
    Authenticator,
    AuthError,
    Principal,
    require_scope,
    resolve_org,
)
from memory_service.canonical import content_hash, fingerprint_digest
from memory_service.cursor import InvalidCursorError, decode_cursor, encode_cursor
from memory_service.errors import ApiError, dumps, error_body
from memory_service.idempotency import Claim, ClaimState, IdempotencyStore, StoredResponse
from memory_service.memories import MemoryRow, MemoryStore, NewMemory
from memory_service.memories import WriteOutcome as Outcome
from memory_service.metrics import CONFLICT_CODES, Metrics
from memory_service.validation import quick_load_create
from schema import describe_errors
from schema.memory import (
    MAX_IDEMPOTENCY_KEY_CHARS,
    MemoryCreateSchema,
    MemoryListQuerySchema,
)

log = logging.getLogger(__name__)

READ, WRITE = "memory:read", "memory:write"
# Built once: a marshmallow Schema is costly to instantiate and safe to share for load().
CREATE_SCHEMA = MemoryCreateSchema()
LIST_QUERY_SCHEMA = MemoryListQuerySchema()
REPLAYED_HEADER = "Idempotent-Replayed"


@dataclass(frozen=True)
class Answer:
    """A response decided by the service; ``storable`` says whether the key keeps it."""

    status: int
    body: bytes
    location: str | None = None
    replayed: bool = False
    storable: bool = True
    #: The error code of a refusal (counted by code when it is a conflict).
    code: str | None = None


@dataclass
class Service:
    """Everything a resource needs, built once by ``create_app``."""

    store: MemoryStore
    idempotency: IdempotencyStore
    auth: Authenticator
    max_body_bytes: int
    metrics: Metrics


def _reject(exc: AuthError) -> ApiError:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    return ApiError(exc.status, exc.code, exc.message, headers=headers)


def _principal(service: Service, req: falcon.Request, scope: str) -> tuple[Principal, uuid.UUID]:
    try:
        principal = service.auth.authenticate(req.get_header("Authorization"))
        require_scope(principal, scope)
        return principal, resolve_org(principal, req.get_header("X-IBEX-Org-ID"))
    except AuthError as exc:
        raise _reject(exc) from None


def _validation_error(messages: Any) -> ApiError:
    return ApiError(
        422,
        "VALIDATION_FAILED",
        f"invalid request: {describe_errors(messages)}",
        fields=messages,
    )


def _load(schema: Schema, data: Any) -> dict[str, Any]:
    try:
        result: dict[str, Any] = schema.load(data)
    except ValidationError as exc:
        raise _validation_error(exc.messages) from None
    return result


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("non-finite number")
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json(raw: bytes) -> Any:
    """Strict JSON: UTF-8, no NaN/Infinity, no numbers that overflow; else 400."""
    try:
        text = raw.decode("utf-8")
        return json.loads(text, parse_float=_finite_float, parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ApiError(400, "MALFORMED_JSON", f"the body is not valid JSON: {exc}") from None


def read_body(req: falcon.Request, limit: int) -> bytes:
    length = req.content_length
    if length is not None and length > limit:
        raise ApiError(413, "BODY_TOO_LARGE", f"the body must be at most {limit} bytes")
    # A chunked body has no length; servers that de-chunk it (gunicorn) say so with
    # wsgi.input_terminated, and only then may the raw stream be read to its end.
    terminated = length is None and req.env.get("wsgi.input_terminated")
    stream = req.stream if terminated else req.bounded_stream
    try:
        raw: bytes = stream.read(limit + 1)
    except Exception as exc:
        # The WSGI server's own error for a body it cannot decode (a broken chunk, a client
        # gone mid-body): the client's mistake, whatever server raised it.
        raise ApiError(400, "BAD_REQUEST", f"the body could not be read: {exc}") from None
    if len(raw) > limit:
        raise ApiError(413, "BODY_TOO_LARGE", f"the body must be at most {limit} bytes")
    return raw


def idempotency_key(req: falcon.Request) -> str | None:
    key = req.get_header("X-Idempotency-Key")
    if key is None:
        return None
    if not key or len(key) > MAX_IDEMPOTENCY_KEY_CHARS or not key.isprintable():
        raise ApiError(
            400,
            "INVALID_HEADER",
            f"X-Idempotency-Key must be 1-{MAX_IDEMPOTENCY_KEY_CHARS} printable characters",
        )
    return key


def canonical_request(validated: dict[str, Any]) -> dict[str, Any]:
    """The validated body as plain JSON, every optional field present: what is fingerprinted."""
    source = validated["source"]
    return {
        "agent_id": str(validated["agent_id"]),
        "content": validated["content"],
        "kind": validated["kind"],
        "metadata": validated["metadata"],
        "source": None
        if source is None
        else {
            "session_id": str(source["session_id"]),
            "turn_index": source["turn_index"],
            "ordinal": source["ordinal"],
        },
    }


def location_of(row: MemoryRow) -> str:
    return f"/v1/memories/{row.id}"


def answer_for_row(row: MemoryRow, *, replayed: bool) -> Answer:
    return Answer(201, dumps(row.as_json()), location_of(row), replayed=replayed)


def answer_for_key_row(row: MemoryRow, fingerprint: str) -> Answer:
    """A committed row already holds this key: the same request replays, another conflicts."""
    if row.request_fingerprint == fingerprint:
        return answer_for_row(row, replayed=True)
    return Answer(
        409,
        error_body(
            "IDEMPOTENCY_CONFLICT",
            "this idempotency key was used with a different body",
            existing_id=str(row.id),
        ),
        code="IDEMPOTENCY_CONFLICT",
    )


def _write(resp: falcon.Response, answer: Answer) -> None:
    resp.status = answer.status
    resp.content_type = falcon.MEDIA_JSON
    resp.data = answer.body
    if answer.location:
        resp.location = answer.location
    if answer.replayed:
        resp.set_header(REPLAYED_HEADER, "true")


class MemoriesResource:
    def __init__(self, service: Service) -> None:
        self.service = service

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        service = self.service
        _, org_id = _principal(service, req, WRITE)
        key = idempotency_key(req)
        data = parse_json(read_body(req, service.max_body_bytes))
        validated = quick_load_create(data)
        if validated is None:  # anything unusual, and every 422, goes through marshmallow
            validated = _load(CREATE_SCHEMA, data)
        canonical = canonical_request(validated)
        fingerprint = fingerprint_digest(canonical)
        source = canonical["source"] or {}
        new = NewMemory(
            agent_id=validated["agent_id"],
            content=validated["content"],
            content_hash=content_hash(validated["content"]),
            kind=validated["kind"],
            metadata=validated["metadata"],
            session_id=validated["source"]["session_id"] if validated["source"] else None,
            turn_index=source.get("turn_index"),
            ordinal=source.get("ordinal"),
            idempotency_key=key,
            fingerprint=fingerprint,
        )
        if key is None:
            _write(resp, self._counted(self._execute(org_id, new)))
            return
        claim = service.idempotency.claim(org_id, key, fingerprint)
        if claim.state is ClaimState.CONFLICT:
            service.metrics.conflicts.labels("IDEMPOTENCY_CONFLICT").inc()
            raise ApiError(
                409, "IDEMPOTENCY_CONFLICT", "this idempotency key was used with a different body"
            )
        if claim.state is ClaimState.RUNNING:
            seconds = max(1, math.ceil(claim.retry_after_ms / 1000))
            service.metrics.conflicts.labels("IDEMPOTENCY_IN_PROGRESS").inc()
            raise ApiError(
                409,
                "IDEMPOTENCY_IN_PROGRESS",
                "a request with this idempotency key is still running",
                headers={"Retry-After": str(seconds)},
                retry_after=seconds,
            )
        if claim.state is ClaimState.DONE:
            assert claim.response is not None
            stored = claim.response
            service.metrics.replays.labels("redis").inc()
            _write(resp, Answer(stored.status, stored.body, stored.location, replayed=True))
            return
        if claim.state is ClaimState.UNAVAILABLE:
            service.metrics.idempotency_unavailable.inc()
        _write(resp, self._counted(self._run_claimed(org_id, key, new, claim)))

    def _counted(self, answer: Answer) -> Answer:
        """Count a decided answer: a replay from the key's row, or a conflict by code."""
        metrics = self.service.metrics
        if answer.replayed:
            metrics.replays.labels("postgres").inc()
        elif answer.code in CONFLICT_CODES:
            metrics.conflicts.labels(answer.code).inc()
        return answer

    def _run_claimed(self, org_id: uuid.UUID, key: str, new: NewMemory, claim: Claim) -> Answer:
        service = self.service
        try:
            answer: Answer | None = None
            if claim.state is ClaimState.TAKEOVER:
                # The previous owner died or stalled past its lease; it may have committed.
                row = service.store.find_by_key(org_id, key)
                if row is not None:
                    answer = answer_for_key_row(row, new.fingerprint)
            if answer is None:
                answer = self._execute(org_id, new)
        except Exception:
            # Nothing stored for this key (5xx, or a failure we did not decide): free it.
            if claim.owned:
                service.idempotency.release(claim)
            raise
        if claim.owned:
            if answer.storable:
                stored = StoredResponse(answer.status, answer.body, answer.location)
                if not service.idempotency.complete(claim, stored):
                    log.info("idempotency record of %s was taken over; not completing", claim.key)
            else:
                service.idempotency.release(claim)
        return answer

    def _execute(self, org_id: uuid.UUID, new: NewMemory) -> Answer:
        result = self.service.store.create(org_id, new)
        row = result.row
        if result.outcome is Outcome.CREATED:
            assert row is not None
            return answer_for_row(row, replayed=False)
        if result.outcome is Outcome.KEY_EXISTS:
            assert row is not None
            return answer_for_key_row(row, new.fingerprint)
        if result.outcome is Outcome.CONTENT_EXISTS:
            assert row is not None
            return Answer(
                409,
                error_body(
                    "DUPLICATE_CONTENT",
                    "a memory with the same content exists for this agent",
                    existing_id=str(row.id),
                ),
                code="DUPLICATE_CONTENT",
            )
        if result.outcome is Outcome.UNKNOWN_ORG:
            return Answer(403, error_body("FORBIDDEN_ORG", "no such org"), storable=False)
        messages: dict[str, Any] = {"agent_id": ["unknown agent for this org"]}
        if result.outcome is Outcome.UNKNOWN_SESSION:
            messages = {"source": {"session_id": ["unknown session for this org"]}}
        return Answer(
            422,
            error_body(
                "VALIDATION_FAILED",
                f"invalid request: {describe_errors(messages)}",
                fields=messages,
            ),
            storable=False,
        )

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        _, org_id = _principal(self.service, req, READ)
        # The cursor first: a malformed one is a 400 of its own, whatever else is wrong.
        after = None
        if "cursor" in req.params:
            try:
                after = decode_cursor(req.params["cursor"])
            except InvalidCursorError:
                raise _cursor_error() from None
        query = _load(LIST_QUERY_SCHEMA, dict(req.params))
        limit = query["limit"]
        rows = self.service.store.list(
            org_id,
            agent_id=query.get("agent_id"),
            session_id=query.get("session_id"),
            limit=limit + 1,
            after=after,
        )
        last = rows[limit - 1] if len(rows) > limit else None
        next_cursor = encode_cursor(last.created_at, last.id) if last else None
        resp.content_type = falcon.MEDIA_JSON
        resp.data = dumps(
            {"items": [r.as_json() for r in rows[:limit]], "next_cursor": next_cursor}
        )


class MemoryResource:
    def __init__(self, service: Service) -> None:
        self.service = service

    def on_get(self, req: falcon.Request, resp: falcon.Response, memory_id: uuid.UUID) -> None:
        _, org_id = _principal(self.service, req, READ)
        row = self.service.store.get(org_id, memory_id)
        if row is None:
            raise ApiError(404, "NOT_FOUND", "no such memory")
        resp.content_type = falcon.MEDIA_JSON
        resp.data = dumps(row.as_json())

    def on_delete(self, req: falcon.Request, resp: falcon.Response, memory_id: uuid.UUID) -> None:
        _, org_id = _principal(self.service, req, WRITE)
        if not self.service.store.soft_delete(org_id, memory_id):
            raise ApiError(404, "NOT_FOUND", "no such memory")
        resp.status = 204


def _cursor_error() -> ApiError:
    return ApiError(
        400,
        "INVALID_CURSOR",
        "cursor: not a cursor this service issued",
        fields={"cursor": ["not a cursor this service issued"]},
    )


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


class OpenApiResource:
    def __init__(self, document: dict[str, Any]) -> None:
        self.body = dumps(document)

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = falcon.MEDIA_JSON
        resp.data = self.body
