"""Signing in and out, the console's front door and its static files."""

from __future__ import annotations

from importlib import resources
from typing import Any

import falcon

from memories.auth import AuthError
from memory_service.console.base import Action, _Base, answer, layout, redirect, secure
from memory_service.console.markup import Markup, fmt, hidden, url
from memory_service.console.session import (
    COOKIE,
    SIGNIN_COOKIE,
    Refused,
    Viewer,
    check_signin_nonce,
    clear_cookie,
    read_form,
    set_cookie,
    signin_nonce,
)

HOME = "/console/people"
STATIC = {"console.css": "text/css; charset=utf-8", "favicon.svg": "image/svg+xml"}


def safe_next(value: str | None) -> str:
    """Where to go after signing in: a console path only (never another site)."""
    if value and value.startswith("/console") and not value.startswith("//"):
        return value
    return HOME


def form_page(next_path: str, nonce: str, problem: str | None = None) -> str:
    body = fmt(
        '{}<form method="post" action="/console/signin" class="signin">{}{}'
        '<label>Token <input type="password" name="token" autocomplete="off" required></label>'
        '<button type="submit">Sign in</button></form>'
        '<p class="meta">The token stays in a cookie only this console reads; what it may read'
        " and do is what the console shows.</p>",
        fmt('<p class="note">{}</p>', problem) if problem else Markup(""),
        hidden("csrf", nonce),
        hidden("next", next_path),
    )
    return layout("Sign in", body)


class SignIn(_Base):
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        nonce = signin_nonce(req, resp)
        answer(resp, 200, form_page(safe_next(req.get_param("next")), nonce))

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        def run() -> None:
            form = read_form(req)
            check_signin_nonce(req, form)
            token = form.get("token", "").strip()
            next_path = safe_next(form.get("next"))
            try:
                principal = self.deps.api.auth.authenticate(f"Bearer {token}")
            except AuthError:
                nonce = signin_nonce(req, resp)
                answer(resp, 401, form_page(next_path, nonce, "Unknown or revoked token."))
                return
            set_cookie(req, resp, COOKIE, token)
            clear_cookie(req, resp, SIGNIN_COOKIE)
            if principal.is_service and next_path == HOME:
                next_path = "/console/pipeline"
            redirect(resp, next_path)

        self._guard(req, resp, run)


class SignOut(Action):
    def post(
        self, req: falcon.Request, who: Viewer, form: dict[str, str], **_: Any
    ) -> str | tuple[str, Markup]:
        raise _SignedOut()

    def on_post(self, req: falcon.Request, resp: falcon.Response, **params: Any) -> None:
        try:
            super().on_post(req, resp, **params)
        except _SignedOut:
            clear_cookie(req, resp, COOKIE)
            redirect(resp, "/console/signin")


class _SignedOut(Exception):
    pass


class Home(_Base):
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        redirect(resp, HOME if req.get_cookie_values(COOKIE) else "/console/signin")


class Static:
    """The stylesheet and the icon, from the package (nothing fetched from elsewhere)."""

    def __init__(self) -> None:
        folder = resources.files("memory_service.console") / "static"
        self.files = {name: (folder / name).read_bytes() for name in STATIC}

    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        if name not in self.files:
            answer(resp, 404, layout("Not found", fmt("<p>No file {}.</p>", name)))
            return
        secure(resp)
        resp.content_type = STATIC[name]
        resp.data = self.files[name]
        resp.set_header("Cache-Control", "public, max-age=3600")


__all__ = ["Home", "Refused", "SignIn", "SignOut", "Static", "url"]
