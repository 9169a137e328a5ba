"""The chat path: ``POST /v1/chat/completions``, OpenAI-compatible, forwarded to the upstream.

An ASGI app (Starlette) served by uvicorn (the Procfile's ``proxy`` line): one event loop holds
thousands of long streaming answers open at the cost of a socket each, where a thread per
request would hold a thread per stream. The upstream is called with one shared
``httpx.AsyncClient`` (keep-alive pool). Database work (the token check, the context search)
runs in the loop's thread pool.

What a call does (the headers are the contract, docs/operations.md):

- The body goes upstream as it came, to ``UPSTREAM_LLM_BASE_URL`` + ``/chat/completions``, with
  the caller's ``Authorization``, else ``UPSTREAM_LLM_API_KEY``, which is spent only for a caller
  with a valid IBEX token in ``X-IBEX-Token`` (anyone else is 401: the proxy is no open relay);
  the answer, an error
  included, comes back unchanged: status, body, content type. A stream (``"stream": true``)
  is relayed chunk by chunk as the upstream sends it (decoded when the upstream compressed
  it, since the content encoding is not passed on).
- ``X-IBEX-Agent`` and ``X-IBEX-Session-ID`` (with ``X-IBEX-Token``, scope
  ``sessions:write``): the call is recorded as the session's next turn. Recording happens after
  the answer, through the spool (:mod:`proxy.spool`; the message is :mod:`sessions.chat`'s);
  nothing about it can fail or delay the answer. Without those headers nothing is recorded.
- ``X-IBEX-Memory: inject`` (scope ``memory:read``): the context block is added to the system
  prompt before the call goes upstream (:mod:`proxy.injection`).

The token is checked as the web process checks it (:class:`memories.auth.Authenticator`):
an unknown token is 401, a missing scope 403. When the database cannot be reached the call is
still answered: without injection, and its turn spooled with the token's hash for the worker
to check once the database is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import peewee
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from core import tracing
from core.config import Settings
from core.db import make_pool
from core.errors import ConfigError, DatabaseUnavailableError
from core.http import CookielessAsyncClient, endpoint_url
from embeddings import QueryCache, embedder_from_settings
from memories.auth import Authenticator, AuthError, Principal, require_scope, resolve_org
from memories.search.context import estimate_tokens
from memories.tokens import TokenStore, hash_token
from proxy import metrics
from proxy.headers import HeaderError, IbexHeaders, read_headers
from proxy.injection import Injector, with_block
from proxy.spool import DramatiqSpool, Spool
from proxy.streaming import StreamAssembler
from schema import describe_errors
from schema.common import may_hold_unstorable, unstorable
from sessions.agents import AgentResolver
from sessions.chat import Recording, spool_message
from sessions.conversation import assistant_message, request_hash
from sessions.store import SessionStore
from sessions.users import UnknownUserError

log = logging.getLogger(__name__)

#: Upstream answer headers passed back to the caller (besides the body's content type).
PASSED_HEADERS = (
    "content-type",
    "retry-after",
    "x-request-id",
    "openai-processing-ms",
    "openai-organization",
    "openai-version",
    "x-ratelimit-limit-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
)
#: Caller headers passed on upstream (besides Authorization and the body's content type).
#: The largest request body the proxy reads (a long conversation, images inline): larger is
#: 413 before anything is forwarded or recorded.
MAX_REQUEST_BYTES = 8 * 1024 * 1024

FORWARDED_HEADERS = ("openai-organization", "openai-project", "accept", "user-agent")
#: While the database is away, a token found valid this long ago may still spend the
#: operator's upstream key (a revocation made during the outage waits for the database).
VERIFIED_GRACE_SECONDS = 900.0
VERIFIED_MAX_ENTRIES = 10_000


async def _body(request: Request, limit: int) -> bytes | None:
    """The request's body, or None once it is over ``limit`` bytes (by its Content-Length or
    as it arrives): never read whole into memory past the limit."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


#: The answer header saying what was done with the call: ``queued`` (the turn is on the spool,
#: stored as the session's next turn by the worker) or ``no: <why nothing was recorded>``.
RECORDED_HEADER = "X-IBEX-Recorded"


def _error(status: int, code: str, message: str, **extra: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": code, "message": message, "type": "ibex_error", **extra}},
        status_code=status,
        headers={RECORDED_HEADER: f"no: refused ({code})"},
    )


@dataclass(frozen=True)
class ChatCall:
    """One chat call as the proxy handles it."""

    body: dict[str, Any]
    recording: Recording | None
    started: float
    #: Why nothing is recorded (None: the call is recorded).
    not_recorded: str | None = None


class ChatProxy:
    def __init__(
        self,
        settings: Settings,
        *,
        db: peewee.Database,
        spool: Spool,
        transport: httpx.AsyncBaseTransport | None = None,
        token_cache_seconds: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not settings.upstream_llm_base_url:
            raise ConfigError(
                "UPSTREAM_LLM_BASE_URL is not set: the chat path has nowhere to forward to",
                variable="UPSTREAM_LLM_BASE_URL",
            )
        self.settings = settings
        self.url = endpoint_url(
            f"{settings.upstream_llm_base_url}/chat/completions", "UPSTREAM_LLM_BASE_URL"
        )
        self.db = db
        self.spool = spool
        self.auth = Authenticator(TokenStore(db), cache_seconds=token_cache_seconds)
        embedder = embedder_from_settings(settings)
        self.injector = Injector(db, QueryCache(embedder) if embedder is not None else None)
        self.clock = clock
        self.client = CookielessAsyncClient(
            transport=transport,
            timeout=httpx.Timeout(
                connect=10.0, read=float(settings.upstream_timeout_seconds), write=60.0, pool=30.0
            ),
            limits=httpx.Limits(max_connections=1000, max_keepalive_connections=100),
        )
        self._pending: set[asyncio.Task[None]] = set()
        #: Token hash -> when this process last found it valid (:meth:`_org`).
        self._verified: dict[str, float] = {}

    # -- lifetime --------------------------------------------------------------------------

    async def settle(self) -> None:
        """Wait for the spool writes in flight (shutdown, tests)."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    async def aclose(self) -> None:
        await self.settle()
        await self.client.aclose()
        close = getattr(self.spool, "close", None)
        if close is not None:
            close()

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await self.aclose()

    # -- the route -------------------------------------------------------------------------

    async def chat_completions(self, request: Request) -> Response:
        started = self.clock()
        raw = await _body(request, MAX_REQUEST_BYTES)
        if raw is None:
            return _error(413, "BODY_TOO_LARGE", f"the body is over {MAX_REQUEST_BYTES} bytes")
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error(400, "BAD_REQUEST", "the body must be a chat completion request")
        try:
            ibex = read_headers(request.headers)
        except HeaderError as exc:
            return _error(400, exc.code, exc.message, header=exc.header)
        headers = request.headers
        agent, external_id, inject = ibex.agent, ibex.external_id, ibex.inject
        records = ibex.records
        if (records or inject) and may_hold_unstorable(raw.decode("utf-8", "replace")):
            problems = unstorable(body)
            if problems is not None:
                # Recorded turns and the injection's query reach Postgres, which cannot store
                # NUL or a lone surrogate: refused before anything is forwarded.
                return _error(
                    422, "VALIDATION_FAILED", f"invalid request: {describe_errors(problems)}"
                )
        recording: Recording | None = None
        token = ibex.token or ""
        # Without the caller's own Authorization the operator's upstream key is spent: only
        # for a caller with a valid IBEX token (never an open relay).
        spends_key = not headers.get("authorization")
        if records or inject or spends_key:
            if not token:
                if records or inject:
                    return _error(401, "UNAUTHORIZED", "recording or injection needs X-IBEX-Token")
                return _error(
                    401,
                    "UNAUTHORIZED",
                    "send X-IBEX-Token (an IBEX token), or your own Authorization for the upstream",
                )
            org_header = headers.get("x-ibex-org-id")
            try:
                org_id, bound = await self._org(
                    token, org_header, records=records, inject=inject, spends_key=spends_key
                )
            except AuthError as exc:
                return _error(exc.status, exc.code, exc.message)
            if org_id is not None and agent is not None:
                refused = await asyncio.to_thread(self._refusal, org_id, ibex, bound)
                if refused is not None:
                    return refused
            if records:
                assert agent is not None and external_id is not None
                recording = Recording(
                    agent=agent,
                    external_id=external_id,
                    user=ibex.user,
                    org_id=org_id,
                    token_hash=None if org_id else hash_token(token),
                    org_header=None if org_id else org_header,
                    user_id=bound,
                    named_user_id=ibex.user_id,
                    end=ibex.end,
                )
            if inject and org_id is not None:
                assert agent is not None
                body = await self._inject(
                    body, org_id, agent, ibex.memory_tokens, ibex.user, bound or ibex.user_id
                )
        not_recorded = ibex.not_recorded() if recording is None else None
        call = ChatCall(body=body, recording=recording, started=started, not_recorded=not_recorded)
        upstream_headers = self._upstream_headers(request)
        if body.get("stream") is True:
            return await self._stream(call, upstream_headers)
        return await self._plain(call, upstream_headers)

    async def _org(
        self,
        token: str,
        org_header: str | None,
        *,
        records: bool,
        inject: bool,
        spends_key: bool = False,
    ) -> tuple[uuid.UUID | None, uuid.UUID | None]:
        """The org the token acts for and the user it is bound to; (None, None) when the
        database is away (the worker checks the token then). While the database is away, a
        call that would spend the operator's upstream key (``spends_key``) is answered only
        for a token this process found valid within :data:`VERIFIED_GRACE_SECONDS`; any
        other is 503."""
        digest = hash_token(token)
        try:
            principal: Principal = await asyncio.to_thread(
                self.auth.authenticate, f"Bearer {token}"
            )
        except (DatabaseUnavailableError, peewee.OperationalError, peewee.InterfaceError):
            if spends_key and not self._recently_verified(digest):
                raise AuthError(
                    503,
                    "TOKEN_UNVERIFIED",
                    "the token cannot be checked while the database is unavailable; retry,"
                    " or send your own Authorization for the upstream",
                ) from None
            log.warning("token check skipped: the database is unavailable")
            return None, None
        self._verified[digest] = self.clock()
        if len(self._verified) > VERIFIED_MAX_ENTRIES:
            self._verified.clear()
        if records:
            require_scope(principal, "sessions:write")
        if inject:
            require_scope(principal, "memory:read")
        return resolve_org(principal, org_header), principal.user_id

    def _refusal(
        self, org_id: uuid.UUID, ibex: IbexHeaders, bound: uuid.UUID | None
    ) -> Response | None:
        """The answer refusing a call that names an agent the org does not have (404
        ``UNKNOWN_AGENT``, as the sessions API: a typo creates nothing) or a user id that is
        not one of the org's users (for a user-bound token: not its own user, answered the same
        as an unknown one); None when both are known. Skipped while the database is away (the
        call is answered, its turn spooled)."""
        assert ibex.agent is not None
        try:
            if AgentResolver(self.db).find(org_id, slug=ibex.agent) is None:
                return _error(
                    404,
                    "UNKNOWN_AGENT",
                    f"no agent {ibex.agent!r} in this org (create it with the sessions API's"
                    ' "create_agent": true, or ibex import)',
                    header="X-IBEX-Agent",
                )
            if ibex.user_id is not None:
                unknown = _error(
                    400,
                    "INVALID_HEADER",
                    "X-IBEX-User-ID names no user of this org",
                    header="X-IBEX-User-ID",
                )
                if bound is not None and ibex.user_id != bound:
                    return unknown
                try:
                    SessionStore(self.db, bind_models=False).resolve_user(
                        org_id, user_id=ibex.user_id
                    )
                except UnknownUserError:
                    return unknown
        except (DatabaseUnavailableError, peewee.OperationalError, peewee.InterfaceError):
            log.warning("agent check skipped: the database is unavailable")
        return None

    def _recently_verified(self, digest: str) -> bool:
        seen = self._verified.get(digest)
        return seen is not None and self.clock() - seen <= VERIFIED_GRACE_SECONDS

    async def _inject(
        self,
        body: dict[str, Any],
        org_id: uuid.UUID,
        agent: str,
        budget: int,
        user: str | None,
        bound: uuid.UUID | None,
    ) -> dict[str, Any]:
        messages = body["messages"]
        try:
            block = await asyncio.to_thread(
                self.injector.block, org_id, agent, messages, budget, user, bound
            )
        except Exception:
            log.warning("memory injection skipped", exc_info=True)
            metrics.injection("failed")
            return body
        if block is None:
            metrics.injection("empty")
            return body
        metrics.injection("injected")
        return {**body, "messages": with_block(messages, block)}

    def _upstream_headers(self, request: Request) -> dict[str, str]:
        out = {"content-type": "application/json"}
        authorization = request.headers.get("authorization")
        if authorization:
            out["authorization"] = authorization
        elif self.settings.upstream_llm_api_key:
            out["authorization"] = f"Bearer {self.settings.upstream_llm_api_key}"
        for name in FORWARDED_HEADERS:
            value = request.headers.get(name)
            if value is not None:
                out[name] = value
        return out

    # -- non-streaming ---------------------------------------------------------------------

    async def _plain(self, call: ChatCall, headers: dict[str, str]) -> Response:
        try:
            answer = await self.client.post(self.url, json=call.body, headers=headers)
        except httpx.HTTPError as exc:
            return _error(502, "UPSTREAM_UNAVAILABLE", f"the upstream did not answer: {exc}")
        response = Response(
            content=answer.content,
            status_code=answer.status_code,
            headers=_passed(answer, _recorded(call, answer)),
        )
        if call.recording is not None and answer.is_success:
            latency_ms = int((self.clock() - call.started) * 1000)
            try:
                data = answer.json()
                message = data["choices"][0].get("message")
                usage = data.get("usage") or {}
            except (ValueError, KeyError, IndexError, TypeError, AttributeError):
                log.warning("upstream answer not recorded: not a chat completion")
                metrics.turn("failed")
                response.headers[RECORDED_HEADER] = "no: the answer is not a chat completion"
                return response
            self._record(
                call,
                model=data.get("model") if isinstance(data, dict) else None,
                completion=assistant_message(message),
                usage=usage if isinstance(usage, dict) else {},
                latency_ms=latency_ms,
                is_streaming=False,
                is_complete=True,
            )
        return response

    # -- streaming -------------------------------------------------------------------------

    async def _stream(self, call: ChatCall, headers: dict[str, str]) -> Response:
        request = self.client.build_request("POST", self.url, json=call.body, headers=headers)
        try:
            answer = await self.client.send(request, stream=True)
        except httpx.HTTPError as exc:
            return _error(502, "UPSTREAM_UNAVAILABLE", f"the upstream did not answer: {exc}")
        if not answer.is_success:
            try:
                content = await answer.aread()
            finally:
                await answer.aclose()
            return Response(
                content=content,
                status_code=answer.status_code,
                headers=_passed(answer, _recorded(call, answer)),
            )
        return _Relay(self, call, answer)

    def _record(
        self,
        call: ChatCall,
        *,
        model: Any,
        completion: dict[str, Any],
        usage: dict[str, Any],
        latency_ms: int,
        is_streaming: bool,
        is_complete: bool,
    ) -> None:
        """Spool the call's turn in the background: the answer never waits for it."""
        assert call.recording is not None
        messages = call.body["messages"]
        prompt_tokens = _int(usage.get("prompt_tokens"))
        completion_tokens = _int(usage.get("completion_tokens"))
        if prompt_tokens is None:
            prompt_tokens = estimate_tokens(json.dumps(messages, ensure_ascii=False))
        if completion_tokens is None:
            completion_tokens = estimate_tokens(str(completion.get("content") or ""))
        message = spool_message(
            call.recording,
            request_hash=request_hash(call.body),
            model=model if isinstance(model, str) else call.body.get("model"),
            messages=messages,
            completion=completion,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            latency_ms=latency_ms,
            is_streaming=is_streaming,
            is_complete=is_complete,
        )
        task = asyncio.get_running_loop().create_task(self._spool(message))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _spool(self, message: dict[str, Any]) -> None:
        try:
            await asyncio.to_thread(self.spool.put, message)
        except Exception:
            log.exception("a chat turn could not be spooled (session %s)", message["external_id"])
            metrics.turn("failed")
            return
        metrics.turn("spooled")

    # -- the app ---------------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def metrics_page(self, request: Request) -> Response:
        body, content_type = metrics.exposition()
        return Response(content=body, media_type=content_type)

    def app(self) -> Starlette:
        from starlette.middleware import Middleware

        from proxy.tracing import TraceRequests

        return Starlette(
            middleware=[Middleware(TraceRequests)] if tracing.enabled() else [],
            routes=[
                Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                Route("/chat/completions", self.chat_completions, methods=["POST"]),
                Route("/healthz", self.healthz, methods=["GET"]),
                Route("/metrics", self.metrics_page, methods=["GET"]),
            ],
            lifespan=self.lifespan,
        )


class _Relay(Response):
    """The upstream's stream relayed as it arrives, then recorded: complete when the upstream
    ended it with ``data: [DONE]``; cut when the upstream broke off or the client left."""

    def __init__(self, proxy: ChatProxy, call: ChatCall, answer: httpx.Response) -> None:
        self.proxy = proxy
        self.call = call
        self.answer = answer
        self.status_code = answer.status_code
        self.background = None
        self.init_headers(_passed(answer, _recorded(call, answer)))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assembler = StreamAssembler()
        left = asyncio.get_running_loop().create_task(_disconnected(receive))
        broke = False
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            try:
                async for chunk in self.answer.aiter_bytes():
                    assembler.feed(chunk)
                    if left.done():
                        broke = True
                        break
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except httpx.HTTPError as exc:
                log.warning("upstream stream broke off: %s", exc)
                broke = True
            if not left.done():
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            broke = True  # the client went away mid-send
        finally:
            left.cancel()
            # Spooled before the upstream is closed: a cancelled relay (shutdown) still records.
            if self.call.recording is not None:
                self.proxy._record(
                    self.call,
                    model=assembler.model,
                    completion=assembler.message(),
                    usage=assembler.usage or {},
                    latency_ms=int((self.proxy.clock() - self.call.started) * 1000),
                    is_streaming=True,
                    is_complete=assembler.done and not broke,
                )
            await self.answer.aclose()


async def _disconnected(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def _passed(answer: httpx.Response, recorded: str) -> dict[str, str]:
    passed = {name: answer.headers[name] for name in PASSED_HEADERS if name in answer.headers}
    passed[RECORDED_HEADER] = recorded
    return passed


def _recorded(call: ChatCall, answer: httpx.Response) -> str:
    """The ``X-IBEX-Recorded`` value of an upstream answer (a cut stream is still recorded,
    marked incomplete)."""
    if call.recording is None:
        return call.not_recorded or "no"
    if not answer.is_success:
        return f"no: the upstream answered {answer.status_code}"
    return "queued; the session ends" if call.recording.end else "queued"


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def create_app(
    settings: Settings,
    *,
    db: peewee.Database | None = None,
    spool: Spool | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    token_cache_seconds: float = 2.0,
) -> tuple[Starlette, ChatProxy]:
    """The ASGI app and its proxy (tests reach the proxy to wait for spool writes)."""
    if db is None:
        db = make_pool(
            settings.require_database_url(), max_connections=16, application_name="ibex-proxy"
        )
    proxy = ChatProxy(
        settings,
        db=db,
        spool=spool or DramatiqSpool(settings.redis_url),
        transport=transport,
        token_cache_seconds=token_cache_seconds,
    )
    return proxy.app(), proxy
