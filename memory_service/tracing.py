"""The web request's span: a Falcon middleware, in the app only when traces are on.

Each request runs inside ``<method> <route>`` (server kind), a child of the ``traceparent`` the
caller sent (the pipeline's memory POST sends its own), with ``http.request.method``,
``http.route`` (the route template, never the path: a path holds ids and search words) and
``http.response.status_code``; a 5xx marks the span failed.
"""

from __future__ import annotations

from typing import Any

import falcon

from core import tracing

#: The process's ``service.name`` unless ``OTEL_SERVICE_NAME`` is set.
WEB_SERVICE = "ibex-web"


class TraceRequests:
    """One server span per request, current while the request is handled."""

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        parent = tracing.parent_of({name: req.get_header(name) for name in tracing.TRACE_FIELDS})
        method = tracing.http_method(req.method)
        req.context.trace_span = tracing.begin(
            method, kind="server", parent=parent, attributes={"http.request.method": method}
        )

    def process_response(
        self, req: falcon.Request, resp: falcon.Response, resource: Any, req_succeeded: bool
    ) -> None:
        running = req.context.get("trace_span")
        if running is None:
            return
        route = req.uri_template
        status = resp.status_code
        if route:
            running.span.update_name(f"{tracing.http_method(req.method)} {route}")
            running.span.set_attribute("http.route", route)
        running.span.set_attribute("http.response.status_code", status)
        if status >= 500:
            from opentelemetry.trace import Status, StatusCode

            running.span.set_status(Status(StatusCode.ERROR))
        running.end()


__all__ = ["WEB_SERVICE", "TraceRequests"]
