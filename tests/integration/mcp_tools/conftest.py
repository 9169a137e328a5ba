"""The MCP server against the real web process: the Procfile's ``web`` line (gunicorn) and
``mcp`` line (streamable HTTP), or ``ibex mcp`` spawned over stdio, both driven by the SDK's
own client. :class:`Agent` is one MCP connection; ``call`` answers the tool's result."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from cli.stack.processes import ROOT, Launcher, free_port

BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Servers:
    web_url: str
    mcp_url: str
    tmp: Path


def process_env(database_url: str, redis_url: str, port: int, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "PORT": str(port),
        "WEB_CONCURRENCY": "1",
        "WEB_THREADS": "4",
        **extra,
    }
    for name in ("PROMETHEUS_MULTIPROC_DIR", "IBEX_TOKEN", "IBEX_AGENT", "IBEX_USER"):
        env.pop(name, None)
    return env


@pytest.fixture
def servers(database_url: str, redis_url: str, db: Any, tmp_path: Path) -> Iterator[Servers]:
    """The Procfile's web line, and its mcp line in front of it, both on loopback."""
    web_port, mcp_port = free_port(), free_port()
    web_url = f"http://127.0.0.1:{web_port}"
    mcp_url = f"http://127.0.0.1:{mcp_port}"
    with Launcher(tmp_path, cwd=ROOT) as launcher:
        launcher.start_procfile(
            "web", process_env(database_url, redis_url, web_port), bind_host="127.0.0.1"
        )
        launcher.start_procfile(
            "mcp",
            process_env(database_url, redis_url, mcp_port, IBEX_URL=web_url),
            bind_host="127.0.0.1",
        )
        launcher.wait_http(f"{web_url}/healthz", timeout=30)
        launcher.wait_http(f"{mcp_url}/healthz", timeout=30)
        yield Servers(web_url, f"{mcp_url}/mcp", tmp_path)


@dataclass
class Result:
    """A tool's answer: ``data`` (the structured result) or ``error`` (the tool error's text)."""

    data: dict[str, Any] | None
    error: str | None


class Agent:
    """One MCP client session."""

    def __init__(self, session: ClientSession) -> None:
        self.session = session

    async def call(self, tool: str, **arguments: Any) -> Result:
        result = await self.session.call_tool(tool, arguments)
        text = " ".join(getattr(c, "text", "") for c in result.content)
        if result.is_error:
            return Result(None, text)
        data = result.structured_content
        assert isinstance(data, dict), f"{tool} answered no structured result: {text}"
        return Result(data, None)

    async def ok(self, tool: str, **arguments: Any) -> dict[str, Any]:
        result = await self.call(tool, **arguments)
        assert result.error is None, f"{tool}({arguments}) failed: {result.error}"
        assert result.data is not None
        return result.data

    async def error(self, tool: str, **arguments: Any) -> str:
        """The tool error's text after the SDK's ``Error executing tool NAME: ``."""
        result = await self.call(tool, **arguments)
        assert result.error is not None, f"{tool}({arguments}) succeeded: {result.data}"
        prefix = f"Error executing tool {tool}: "
        assert result.error.startswith(prefix), result.error
        return result.error.removeprefix(prefix)


@contextlib.asynccontextmanager
async def stdio_agent(
    url: str, token: str, tmp: Path, agent: str | None = None, user: str | None = None
) -> AsyncIterator[Agent]:
    """``ibex mcp`` spawned as an assistant spawns it, configured by its environment only."""
    env = {"IBEX_URL": url, "IBEX_TOKEN": token, "PYTHONPATH": str(ROOT)}
    if agent is not None:
        env["IBEX_AGENT"] = agent
    if user is not None:
        env["IBEX_USER"] = user
    params = StdioServerParameters(command=str(BIN / "ibex"), args=["mcp"], env=env, cwd=ROOT)
    with (tmp / "stdio-mcp.log").open("a") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield Agent(session)


@contextlib.asynccontextmanager
async def http_agent(url: str, token: str | None) -> AsyncIterator[Agent]:
    """The streamable HTTP client of the SDK, with the token as its bearer."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with (
        create_mcp_http_client(headers=headers) as client,
        streamable_http_client(url, http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield Agent(session)


TRANSPORTS = ("stdio", "http")

#: ``connect(token, agent=...)``: an :class:`Agent` on the transport under test.
Connect = Callable[..., contextlib.AbstractAsyncContextManager[Agent]]


@pytest.fixture(params=TRANSPORTS)
def connect(request: pytest.FixtureRequest, servers: Servers) -> Connect:
    """Over stdio the agent comes from IBEX_AGENT; over HTTP, where one process serves every
    caller, from the tools' ``agent`` argument (see :func:`with_agent`)."""
    if request.param == "stdio":

        def stdio(token: str, agent: str | None = None, user: str | None = None) -> Any:
            return stdio_agent(servers.web_url, token, servers.tmp, agent, user)

        return stdio

    @contextlib.asynccontextmanager
    async def http(
        token: str, agent: str | None = None, user: str | None = None
    ) -> AsyncIterator[Agent]:
        async with http_agent(servers.mcp_url, token) as connected:
            yield Defaults(connected.session, agent, user)

    return http


class Defaults(Agent):
    """An HTTP agent that passes ``agent``/``user`` as arguments, as IBEX_AGENT/IBEX_USER do
    over stdio, to the tools that take them."""

    TAKES_AGENT = frozenset({"remember", "recall", "context", "list_memories"})

    def __init__(self, session: ClientSession, agent: str | None, user: str | None) -> None:
        super().__init__(session)
        self.agent = agent
        self.user = user

    async def call(self, tool: str, **arguments: Any) -> Result:
        if self.agent is not None and tool in self.TAKES_AGENT:
            arguments.setdefault("agent", self.agent)
        if self.user is not None:
            arguments.setdefault("user", self.user)
        return await super().call(tool, **arguments)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# -- a web process whose answers can be lost -------------------------------------------------


@dataclass
class LossyProxy:
    """A proxy to the web process that forwards every request and drops the answer of the
    first ``drop`` POSTs to /v1/memories (closing the connection instead): the memory is
    stored, the caller never hears it."""

    target: str
    drop: int = 1
    posts: list[bytes] = field(default_factory=list)
    url: str = ""

    @contextlib.contextmanager
    def running(self) -> Iterator[LossyProxy]:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() not in ("host", "content-length", "connection")
                }
                answer = httpx.request(
                    self.command, proxy.target + self.path, headers=headers, content=body
                )
                if self.command == "POST" and self.path == "/v1/memories":
                    proxy.posts.append(body)
                    if len(proxy.posts) <= proxy.drop:
                        return  # stored; the answer is lost with the connection
                self.send_response(answer.status_code)
                for k, v in answer.headers.items():
                    if k.lower() not in ("content-length", "connection", "transfer-encoding"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = do_DELETE = _forward

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            server.shutdown()
            server.server_close()


def memory_json(body: bytes) -> dict[str, Any]:
    return json.loads(body)
