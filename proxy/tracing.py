"""The chat call's span: an ASGI middleware, in the app only when traces are on.

Each request runs inside ``<method> <route>`` (server kind), a child of the ``traceparent`` the
application sent, with ``http.request.method``, ``http.route`` (one of the app's fixed routes,
else none) and ``http.response.status_code``. The spool write is started inside it, so the
``record_chat_turn`` message carries this span's context (:mod:`proxy.spool`).
"""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core import tracing

#: The routes a span may name (a path outside them is not recorded: it is the caller's text).
ROUTES = frozenset({"/v1/chat/completions", "/chat/completions", "/healthz", "/metrics"})


class TraceRequests:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not tracing.enabled():
            await self.app(scope, receive, send)
            return
        wanted = {name.encode() for name in tracing.TRACE_FIELDS}
        carrier = {
            key.decode("latin-1").lower(): value.decode("latin-1")
            for key, value in scope.get("headers", ())
            if key.lower() in wanted
        }
        method = tracing.http_method(str(scope.get("method", "")))
        route = scope.get("path") if scope.get("path") in ROUTES else None
        attributes: dict[str, Any] = {"http.request.method": method, "http.route": route}
        name = f"{method} {route}" if route else method
        with tracing.span(
            name, kind="server", parent=tracing.parent_of(carrier), attributes=attributes
        ) as span:

            async def sending(message: Message) -> None:
                if message["type"] == "http.response.start":
                    span.set_attribute("http.response.status_code", int(message["status"]))
                await send(message)

            await self.app(scope, receive, sending)


__all__ = ["ROUTES", "TraceRequests"]
