"""The MCP server over streamable HTTP: the Procfile's ``mcp`` process (``ibex mcp --transport
http``), stateless with JSON answers, each caller's token its request's bearer token."""

from __future__ import annotations

import dataclasses
import json

from starlette.types import ASGIApp, Receive, Scope, Send

from mcp_server.calls import bearer
from mcp_server.config import McpConfig
from mcp_server.tools import build_server


class RequireBearer:
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
        if bearer(header) is None:
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
    return RequireBearer(app)
