"""What every console page shares: the security headers, the layout, and the way a page or a
form is answered (sign-in redirect, an HTML refusal, the CSRF check before any change)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import falcon

from core.errors import DatabaseUnavailableError
from memory_service.console.deps import ConsoleDeps
from memory_service.console.markup import Markup, esc, fmt, hidden, link, url
from memory_service.console.session import (
    Refused,
    SignInNeeded,
    Viewer,
    read_form,
    viewer,
)
from memory_service.errors import ErrorAnswer

#: No script at all, no inline style, nothing from elsewhere; forms post to the console only.
CSP = (
    "default-src 'self'; script-src 'none'; style-src 'self'; img-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def secure(resp: falcon.Response) -> None:
    for name, value in HEADERS.items():
        resp.set_header(name, value)


def layout(title: str, body: Markup, who: Viewer | None = None) -> str:
    nav = Markup("")
    if who is not None:
        items = [
            link(url("/console/people", who.params()), "People"),
            link(url("/console/conversations", who.params()), "Conversations"),
            link(url("/console/search", who.params()), "Search"),
        ]
        if who.operator:
            items.append(link(url("/console/pipeline", who.params()), "Pipeline"))
        p = who.principal
        if p.is_service:
            identity = "service token" + (f", org {who.org_id}" if who.org_id else "")
        else:
            identity = f"org {who.org_id}" + (", one person" if p.user_id else "")
        nav = fmt(
            '<nav>{}<span class="who">{}; scopes {}</span>'
            '<form method="post" action="/console/signout" class="inline">{}'
            '<button type="submit">Sign out</button></form></nav>',
            Markup(" ".join(items)),
            identity,
            " ".join(sorted(p.scopes)),
            hidden("csrf", who.csrf),
        )
    return fmt(
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<title>{} · IBEX console</title>"
        '<link rel="stylesheet" href="/console/static/console.css">'
        '<link rel="icon" type="image/svg+xml" href="/console/static/favicon.svg">'
        '</head><body><header><a class="brand" href="/console">IBEX console</a>{}</header>'
        "<main><h1>{}</h1>{}</main></body></html>\n",
        title,
        nav,
        title,
        body,
    )


def answer(resp: falcon.Response, status: int, html: str) -> None:
    secure(resp)
    resp.status = status
    resp.content_type = falcon.MEDIA_HTML
    resp.text = html


def redirect(resp: falcon.Response, location: str) -> None:
    secure(resp)
    resp.status = 303
    resp.location = location


class _Base:
    def __init__(self, deps: ConsoleDeps) -> None:
        self.deps = deps

    def _guard(
        self,
        req: falcon.Request,
        resp: falcon.Response,
        run: Callable[[], None],
        seen: list[Viewer] | None = None,
    ) -> None:
        """Run ``run``, answering its refusals as pages (with the navigation of the viewer it
        put in ``seen``, once known)."""
        try:
            run()
        except SignInNeeded:
            if req.method == "GET":
                redirect(resp, url("/console/signin", {"next": req.relative_uri}))
            else:
                answer(resp, 401, layout("Signed out", esc("Sign in again."), None))
        except (Refused, ErrorAnswer, DatabaseUnavailableError) as exc:
            who = seen[0] if seen else None
            if isinstance(exc, Refused):
                status, title, message = exc.status, exc.title, exc.message
            elif isinstance(exc, ErrorAnswer):
                status, title, message = exc.status_code, "Refused", exc.message
            else:
                status, title, message = 503, "Unavailable", "The database did not answer."
            answer(resp, status, layout(title, fmt("<p>{}</p>", message), who))


class Page(_Base):
    """A GET page: :meth:`get` returns (title, body) for the signed-in viewer."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, **params: Any) -> None:
        seen: list[Viewer] = []

        def run() -> None:
            who = viewer(self.deps.api, req)
            seen.append(who)
            title, body = self.get(req, who, **params)
            answer(resp, 200, layout(title, body, who))

        self._guard(req, resp, run, seen)

    def get(self, req: falcon.Request, who: Viewer, **params: Any) -> tuple[str, Markup]:
        raise NotImplementedError


class Action(_Base):
    """A POST form: the CSRF token is checked before :meth:`post`, which returns where to go
    next (303) or a (title, body) page to show."""

    def on_post(self, req: falcon.Request, resp: falcon.Response, **params: Any) -> None:
        seen: list[Viewer] = []

        def run() -> None:
            who = viewer(self.deps.api, req)
            seen.append(who)
            form = read_form(req)
            who.check_csrf(form)
            result = self.post(req, who, form, **params)
            if isinstance(result, str):
                redirect(resp, result)
            else:
                answer(resp, 200, layout(result[0], result[1], who))

        self._guard(req, resp, run, seen)

    def post(
        self, req: falcon.Request, who: Viewer, form: dict[str, str], **params: Any
    ) -> str | tuple[str, Markup]:
        raise NotImplementedError
