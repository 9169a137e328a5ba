"""Each tool call's token, agent and user, one connection pool for all of them, and the
client's errors translated; and the idempotency key of ``remember``.

Every tool call opens an :class:`~ibex_client.AsyncIbexClient` with the caller's token: the
process's ``IBEX_TOKEN`` on stdio, the request's bearer token over HTTP. The agent is ``agent``
(a tool argument) or ``IBEX_AGENT``: an agent's id, or its slug, resolved once per token with
``GET /v1/agents/{slug}``; a slug the org does not have is a tool error (``UNKNOWN_AGENT``),
never a new agent.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError

from ibex_client import ApiError, AsyncIbexClient, IbexClientError, IbexTransportError
from mcp_server.answers import api_error, argument_error
from mcp_server.config import MAX_RESOLVED, McpConfig

T = TypeVar("T")


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


def shared_pool(
    timeout: float, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    """The one connection pool of every caller's calls, which keeps no cookies: a cookie one
    caller's answer set (a proxy or CDN in front of the service) is dropped, and no request
    carries one, so nothing of one token's session rides on another token's call. (The
    worker's clients get the same from ``core.http``, which this door may not import.)"""
    http = httpx.AsyncClient(
        timeout=httpx.Timeout(timeout), follow_redirects=False, transport=transport
    )

    async def send_no_cookie(request: httpx.Request) -> None:
        request.headers.pop("cookie", None)

    async def keep_no_cookie(response: httpx.Response) -> None:
        http.cookies.clear()

    http.event_hooks = {"request": [send_no_cookie], "response": [keep_no_cookie]}
    return http


@dataclass
class Calls:
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
            token = bearer(getattr(request, "headers", {}).get("authorization"))
            if token is None:
                raise ToolError("UNAUTHORIZED: expected 'Authorization: Bearer <token>'")
            return token
        if not self.config.token:
            raise ToolError("UNAUTHORIZED: IBEX_TOKEN is not set")
        return self.config.token

    def client(self, token: str) -> AsyncIbexClient:
        if self.http is None:
            self.http = shared_pool(self.config.timeout)
        return AsyncIbexClient(self.config.url, token, client=self.http)

    def user(self, given: str | None) -> str | None:
        user = given if given is not None else self.config.user
        if user is not None and not 1 <= len(user) <= 200:
            raise argument_error("user", "must be 1-200 characters")
        return user

    async def agent_id(
        self, ibex: AsyncIbexClient, token: str, given: str | None, *, required: bool = True
    ) -> uuid.UUID | None:
        agent = given if given is not None else self.config.agent
        if agent is None:
            if required:
                raise argument_error("agent", "no agent: pass agent or set IBEX_AGENT")
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
                raise api_error(exc) from None
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
            raise api_error(exc) from None
        except IbexTransportError as exc:
            raise ToolError(f"UNAVAILABLE: the memory service did not answer ({exc})") from None
        except IbexClientError as exc:
            raise ToolError(f"UNEXPECTED_RESPONSE: {exc}") from None


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer`` header, or None."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None
