"""The tools (``remember``, ``recall``, ``context``, ``forget``, ``list_memories``), the
per-call choice of token, agent and user, and the HTTP app.

Every tool call opens an :class:`~ibex_client.AsyncIbexClient` with the caller's token: the
process's ``IBEX_TOKEN`` on stdio, the request's bearer token over HTTP (a request without one
is answered 401 before the MCP layer sees it). The service decides what the token may do; a
refusal comes back as a tool error carrying the API's code and message (``FORBIDDEN: ...``),
never as a crashed server. Arguments are typed (the SDK validates them against the schema it
publishes), and a value the service rejects field by field names the field.

The agent is ``agent`` (a tool argument) or ``IBEX_AGENT``: an agent's id, or its slug. The
memory routes take an id, so a slug is resolved once per token with ``GET /v1/agents/{slug}``
(any token of the org may ask); a slug the org does not have is a tool error
(``UNKNOWN_AGENT``), never a new agent. An id needs nothing more.

``remember`` stores a memory with no source (the API allows it: a memory an agent states is
not extracted from a session turn) under an idempotency key derived from the call's arguments
and scope (token, agent, user, content, kind), so the same call repeated after a lost answer
(by the client's own retries, or by the agent calling again) stores one memory; content the
agent already has answers the memory that holds it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeVar

import httpx
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field
from starlette.types import ASGIApp, Receive, Scope, Send

from ibex_client import (
    ApiError,
    AsyncIbexClient,
    DuplicateContentError,
    IbexClientError,
    IbexTransportError,
    Memory,
    NotFoundError,
    SearchHit,
)

log = logging.getLogger("ibex.mcp")
T = TypeVar("T")

TOOL_NAMES = ("remember", "recall", "context", "forget", "list_memories")
#: ``kind`` of a memory (the API's list; the client's ``MEMORY_KINDS``).
Kind = Literal["fact", "preference", "event", "other"]
#: The service's search limit.
MAX_RECALL = 50
#: Agent slugs resolved and remembered at most (per process, over every token).
MAX_RESOLVED = 1024
#: The service's limit of a memory's content, in characters.
MAX_CONTENT = 4000
#: The service's page size limit.
MAX_PAGE = 200


@dataclass(frozen=True)
class McpConfig:
    """Where the memory service is and who calls it by default.

    ``token`` is used only on stdio (over HTTP each request brings its own); ``agent`` and
    ``user`` are the defaults that a tool's ``agent``/``user`` arguments override.
    """

    url: str
    token: str | None = None
    agent: str | None = None
    user: str | None = None
    timeout: float = 10.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> McpConfig:
        env = os.environ if env is None else env
        return cls(
            url=(env.get("IBEX_URL") or "http://127.0.0.1:8000").rstrip("/"),
            token=env.get("IBEX_TOKEN") or None,
            agent=env.get("IBEX_AGENT") or None,
            user=env.get("IBEX_USER") or None,
        )


# -- what the tools answer -------------------------------------------------------------------


class MemoryOut(BaseModel):
    """A stored memory."""

    id: str
    agent_id: str
    content: str
    kind: str
    source_session_id: str | None = Field(description="The conversation it came from, if any.")
    metadata: dict[str, Any]
    created_at: str


class SignalsOut(BaseModel):
    """Why a memory matched, each in [0, 1], higher is better."""

    text: float = Field(description="Full-text rank.")
    trigram: float = Field(description="Trigram similarity (names, typos); 0 without pg_trgm.")
    recency: float = Field(description="1 / (1 + age in days / 30); breaks ties.")
    semantic: float | None = Field(
        default=None,
        description="Cosine similarity of meaning (embeddings); null without a vector or an"
        " embedder for this search.",
    )


class Hit(BaseModel):
    """A memory that matched, with why."""

    memory: MemoryOut
    score: float = Field(description="The fused score in [0, 1], higher is better.")
    signals: SignalsOut
    snippet: str = Field(description="The content with the matched words in <mark> tags.")


class Remembered(BaseModel):
    memory: MemoryOut
    already_known: bool = Field(
        description="True when the agent already had this content: the memory that holds it."
    )


class Recalled(BaseModel):
    hits: list[Hit] = Field(description="Best first.")


class PackedContext(BaseModel):
    context: str = Field(description="The <memories> block for a system prompt ('' if none).")
    memories: list[Hit] = Field(description="The packed memories, in the block's order.")
    tokens: int = Field(description="Estimated size of the block, never over max_tokens.")
    dropped: int = Field(description="Matching memories left out for the budget.")


class ForgottenOut(BaseModel):
    memory_id: str
    forgotten: bool


class MemoryPage(BaseModel):
    memories: list[MemoryOut] = Field(description="Newest first.")
    next_cursor: str | None = Field(
        description="Pass as cursor for the next page; None at the end."
    )


def _memory(m: Memory) -> MemoryOut:
    return MemoryOut(
        id=str(m.id),
        agent_id=str(m.agent_id),
        content=m.content,
        kind=m.kind,
        source_session_id=None if m.source is None else str(m.source.session_id),
        metadata=dict(m.metadata),
        created_at=m.created_at.isoformat(),
    )


def _hit(h: SearchHit) -> Hit:
    return Hit(
        memory=_memory(h.memory),
        score=h.score,
        signals=SignalsOut(
            text=h.signals.text,
            trigram=h.signals.trigram,
            recency=h.signals.recency,
            semantic=h.signals.semantic,
        ),
        snippet=h.snippet,
    )


# -- errors ----------------------------------------------------------------------------------


def _api_error(exc: ApiError) -> ToolError:
    """The API's refusal as a tool error: code, message, and the fields of a 422."""
    text = f"{exc.code or exc.status}: {exc.message or 'the memory service refused the call'}"
    if exc.fields:
        text += " (" + "; ".join(f"{k}: {_flat(v)}" for k, v in sorted(exc.fields.items())) + ")"
    return ToolError(text)


def _flat(value: Any) -> str:
    if isinstance(value, list):
        return " ".join(_flat(v) for v in value)
    if isinstance(value, dict):
        return "; ".join(f"{k}: {_flat(v)}" for k, v in value.items())
    return str(value)


def _argument_error(name: str, message: str) -> ToolError:
    return ToolError(f"INVALID_ARGUMENT: {name}: {message}")


# -- the idempotency key of remember ---------------------------------------------------------


#: How many times one content may be remembered again after being forgotten (each time takes
#: one more key of :func:`next_remember_key`'s chain, and one more request per ``remember``).
MAX_REMEMBER_GENERATIONS = 20


def next_remember_key(key: str, forgotten: uuid.UUID) -> str:
    """The key that stores a ``remember`` again after the memory ``key`` stored was
    forgotten: the same for every retry, another for each forgotten memory."""
    text = f"{key}:{forgotten}"
    return "mcp-remember-" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def remember_key(token: str, agent_id: uuid.UUID, user: str | None, content: str, kind: str) -> str:
    """The idempotency key of a ``remember`` call: the same for the same arguments and scope,
    so a repeat after a lost answer replays the first call's memory instead of storing another.
    The token enters only as a hash (the key is stored by the service)."""
    scope = {
        "v": 1,
        "token": hashlib.sha256(token.encode("utf-8")).hexdigest(),
        "agent_id": str(agent_id),
        "user": user,
        "content": content,
        "kind": kind,
    }
    text = json.dumps(scope, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "mcp-remember-" + hashlib.sha256(text.encode("utf-8")).hexdigest()


# -- the server ------------------------------------------------------------------------------


@dataclass
class _Calls:
    """Token, agent and user of each call, and the client calls with errors translated."""

    config: McpConfig
    #: (token hash, slug) -> agent id, filled as slugs are resolved (the oldest forgotten
    #: beyond :data:`MAX_RESOLVED`).
    agents: dict[tuple[str, str], uuid.UUID] = field(default_factory=dict)
    #: One connection pool for every call (every token: the client sends each call's own
    #: Authorization header), made on the first call, inside the server's event loop.
    http: httpx.AsyncClient | None = None
    #: Sessions running now: the pool is closed when the last one ends (stdio: at exit; an
    #: in-process client: when it disconnects), and made again by the next call.
    sessions: int = 0

    @contextlib.asynccontextmanager
    async def lifespan(self, server: Any) -> AsyncIterator[dict[str, Any]]:
        self.sessions += 1
        try:
            yield {}
        finally:
            self.sessions -= 1
            if self.sessions == 0 and self.http is not None:
                http, self.http = self.http, None
                await http.aclose()

    def token(self, ctx: Context) -> str:
        request = ctx.request_context.request
        if request is not None:  # HTTP: the caller's own bearer token, never the process's
            token = _bearer(getattr(request, "headers", {}).get("authorization"))
            if token is None:
                raise ToolError("UNAUTHORIZED: expected 'Authorization: Bearer <token>'")
            return token
        if not self.config.token:
            raise ToolError("UNAUTHORIZED: IBEX_TOKEN is not set")
        return self.config.token

    def client(self, token: str) -> AsyncIbexClient:
        if self.http is None:
            self.http = httpx.AsyncClient(
                timeout=httpx.Timeout(self.config.timeout), follow_redirects=False
            )
        return AsyncIbexClient(self.config.url, token, client=self.http)

    def user(self, given: str | None) -> str | None:
        user = given if given is not None else self.config.user
        if user is not None and not 1 <= len(user) <= 200:
            raise _argument_error("user", "must be 1-200 characters")
        return user

    async def agent_id(
        self, ibex: AsyncIbexClient, token: str, given: str | None, *, required: bool = True
    ) -> uuid.UUID | None:
        agent = given if given is not None else self.config.agent
        if agent is None:
            if required:
                raise _argument_error("agent", "no agent: pass agent or set IBEX_AGENT")
            return None
        agent = agent.strip()
        try:
            return uuid.UUID(agent)
        except ValueError:
            pass
        key = (hashlib.sha256(token.encode("utf-8")).hexdigest(), agent)
        if key not in self.agents:
            try:
                found = await ibex.get_agent(agent)
            except ApiError as exc:
                raise _api_error(exc) from None
            if len(self.agents) >= MAX_RESOLVED:
                del self.agents[next(iter(self.agents))]
            self.agents[key] = found.id
        return self.agents[key]

    async def run(self, step: Callable[[], Awaitable[T]]) -> T:
        """One step of a tool, with every client error as a tool error."""
        try:
            return await step()
        except ToolError:
            raise
        except ApiError as exc:
            raise _api_error(exc) from None
        except IbexTransportError as exc:
            raise ToolError(f"UNAVAILABLE: the memory service did not answer ({exc})") from None
        except IbexClientError as exc:
            raise ToolError(f"UNEXPECTED_RESPONSE: {exc}") from None


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


AgentArg = Annotated[
    str | None,
    Field(description="The agent (its id or slug); default IBEX_AGENT.", max_length=200),
]
UserArg = Annotated[
    str | None,
    Field(
        description="Whose memory (the application's key for the person); default IBEX_USER."
        " A user-bound token is always its own user.",
        max_length=200,
    ),
]


def build_server(config: McpConfig) -> MCPServer[Any]:
    """The MCP server with the five tools, calling the service at ``config.url``."""
    calls = _Calls(config)
    server: MCPServer[Any] = MCPServer(
        "ibex",
        lifespan=calls.lifespan,
        title="IBEX memory",
        instructions=(
            "Long-term memory of this agent. Use recall or context before answering questions"
            " about the user or past conversations; remember stable facts and preferences the"
            " user states; forget what the user asks to be forgotten."
        ),
    )
    reads = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    @server.tool(
        annotations=ToolAnnotations(
            read_only_hint=False, destructive_hint=False, idempotent_hint=True
        )
    )
    async def remember(
        content: Annotated[
            str,
            Field(
                description="The memory, one self-contained statement.",
                min_length=1,
                max_length=MAX_CONTENT,
            ),
        ],
        ctx: Context,
        kind: Annotated[Kind, Field(description="What sort of memory it is.")] = "fact",
        agent: AgentArg = None,
        user: UserArg = None,
    ) -> Remembered:
        """Store a long-term memory for the agent (and the user, if any). Safe to repeat: the
        same call again returns the same memory, and content the agent already has returns
        the memory that holds it."""
        token = calls.token(ctx)
        who = calls.user(user)
        async with calls.client(token) as ibex:
            agent_id = await calls.run(lambda: calls.agent_id(ibex, token, agent))
            assert agent_id is not None
            first_key = remember_key(token, agent_id, who, content, kind)

            async def store() -> Remembered:
                key = first_key
                try:
                    for _ in range(MAX_REMEMBER_GENERATIONS):
                        stored = await ibex.create_memory(
                            agent_id, content, kind=kind, idempotency_key=key, user=who
                        )
                        if not stored.replayed:
                            return Remembered(memory=_memory(stored), already_known=False)
                        # A replay names the memory an earlier call stored: known, unless it
                        # was forgotten since. Then the content is stored again under the next
                        # key of the chain (derived from the forgotten memory, so a retry of
                        # this call lands on the same new memory).
                        try:
                            current = await ibex.get_memory(stored.id, user=who)
                        except NotFoundError:
                            key = next_remember_key(key, stored.id)
                            continue
                        except ApiError:  # e.g. a token without memory:read: cannot tell
                            current = stored
                        return Remembered(memory=_memory(current), already_known=True)
                    raise ToolError(
                        "this content was remembered and forgotten too many times; give it"
                        " other words"
                    )
                except DuplicateContentError as exc:
                    if exc.existing_id is None:
                        raise
                    try:
                        known = await ibex.get_memory(exc.existing_id, user=who)
                    except ApiError as hidden:  # e.g. a token without memory:read
                        raise ToolError(
                            f"DUPLICATE_CONTENT: the agent already has this content, as memory"
                            f" {exc.existing_id} ({hidden.code or hidden.status} reading it)"
                        ) from None
                    return Remembered(memory=_memory(known), already_known=True)
                return Remembered(memory=_memory(stored), already_known=False)

            return await calls.run(store)

    @server.tool(annotations=reads)
    async def recall(
        query: Annotated[str, Field(description="What to look for: a question, a name, words.")],
        ctx: Context,
        limit: Annotated[
            int, Field(description=f"Hits at most (1-{MAX_RECALL}).", ge=1, le=MAX_RECALL)
        ] = 10,
        agent: AgentArg = None,
        user: UserArg = None,
    ) -> Recalled:
        """Search the agent's memories, best first, each with why it matched: the fused score,
        the per-signal scores (full text, trigram, recency, meaning) and a highlighted
        snippet."""
        token = calls.token(ctx)
        who = calls.user(user)
        async with calls.client(token) as ibex:
            agent_id = await calls.run(lambda: calls.agent_id(ibex, token, agent))
            assert agent_id is not None
            hits = await calls.run(
                lambda: ibex.search(query, agent_id=agent_id, limit=limit, user=who)
            )
        return Recalled(hits=[_hit(h) for h in hits])

    @server.tool(annotations=reads)
    async def context(
        query: Annotated[str, Field(description="What the agent is about to answer.")],
        ctx: Context,
        max_tokens: Annotated[
            int, Field(description="Budget of the block in estimated tokens.", ge=1)
        ] = 400,
        agent: AgentArg = None,
        user: UserArg = None,
    ) -> PackedContext:
        """The person's standing facts (allergies, who they are, where they live, their
        people; all of their memories when they fit), then the memories relevant to the query,
        packed into a token budget as a <memories> block ready to put into a system prompt."""
        token = calls.token(ctx)
        who = calls.user(user)
        async with calls.client(token) as ibex:
            agent_id = await calls.run(lambda: calls.agent_id(ibex, token, agent))
            assert agent_id is not None
            packed = await calls.run(
                lambda: ibex.context(agent_id, query=query, max_tokens=max_tokens, user=who)
            )
        return PackedContext(
            context=packed.context,
            memories=[_hit(h) for h in packed.memories],
            tokens=packed.tokens,
            dropped=packed.dropped,
        )

    @server.tool(
        annotations=ToolAnnotations(
            read_only_hint=False, destructive_hint=True, idempotent_hint=True
        )
    )
    async def forget(
        memory_id: Annotated[uuid.UUID, Field(description="The id of the memory to forget.")],
        ctx: Context,
        user: UserArg = None,
    ) -> ForgottenOut:
        """Forget one memory (a soft delete: it is never recalled again). A memory this token
        cannot see (another org's, another user's, or already forgotten) is NOT_FOUND."""
        token = calls.token(ctx)
        who = calls.user(user)
        async with calls.client(token) as ibex:
            # The delete reaches what the token reads for that user (delete follows read).
            deleted = await calls.run(lambda: ibex.delete_memory(memory_id, user=who))
        if not deleted:
            raise ToolError(f"NOT_FOUND: no memory {memory_id} (or it is already forgotten)")
        return ForgottenOut(memory_id=str(memory_id), forgotten=True)

    @server.tool(annotations=reads)
    async def list_memories(
        ctx: Context,
        cursor: Annotated[
            str | None, Field(description="next_cursor of the previous page; none for the first.")
        ] = None,
        limit: Annotated[
            int | None,
            Field(description=f"Memories per page (1-{MAX_PAGE}, default 50).", ge=1, le=MAX_PAGE),
        ] = None,
        agent: AgentArg = None,
        user: UserArg = None,
    ) -> MemoryPage:
        """One page of the agent's memories, newest first (every agent of the org when there
        is no agent). Pass next_cursor back as cursor for the next page."""
        token = calls.token(ctx)
        who = calls.user(user)
        async with calls.client(token) as ibex:
            agent_id = await calls.run(lambda: calls.agent_id(ibex, token, agent, required=False))
            page = await calls.run(
                lambda: ibex.list_memories(agent_id=agent_id, cursor=cursor, limit=limit, user=who)
            )
        return MemoryPage(memories=[_memory(m) for m in page.items], next_cursor=page.next_cursor)

    return server


# -- streamable HTTP -------------------------------------------------------------------------


class _RequireBearer:
    """Answers 401 in the service's error format to an MCP request without a bearer token, so a
    client learns it at connect time; the token itself is checked by the service on each
    call. ``/healthz`` is open."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") == "/healthz":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        header = headers.get(b"authorization", b"").decode("latin-1")
        if _bearer(header) is None:
            body = json.dumps(
                {
                    "error": {
                        "code": "UNAUTHORIZED",
                        "message": "expected 'Authorization: Bearer <token>'",
                    }
                }
            ).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"www-authenticate", b"Bearer"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)


def http_app(config: McpConfig, *, host: str = "127.0.0.1") -> ASGIApp:
    """The streamable HTTP app at ``/mcp`` (and ``/healthz``), stateless with JSON answers:
    every request stands alone, so any number of processes serve it without sticky sessions.
    Each caller's token is its request's bearer token, the user a tool's ``user`` argument or
    the token's own; ``config.agent`` stays the default agent. ``host`` 127.0.0.1 or localhost
    turns on the SDK's DNS-rebinding protection."""
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

    # A shared server acts for many people: no process-wide user (IBEX_USER) nor token.
    server = build_server(dataclasses.replace(config, user=None, token=None))

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    server.custom_route("/healthz", methods=["GET"])(healthz)

    app = server.streamable_http_app(stateless_http=True, json_response=True, host=host)
    return _RequireBearer(app)
