"""Who is looking at the console: the token kept in a cookie, checked by the service's own
bearer check on every request, and the CSRF token of every form.

- The token is kept in an HttpOnly, SameSite=Strict cookie whose path is ``/console`` (Secure
  when the request came over https): scripts cannot read it, other sites' pages cannot send
  it, and the JSON API never receives it.
- The token is checked like an ``Authorization: Bearer`` header, by the same
  :class:`~memories.auth.Authenticator` (revoked tokens stop working within its cache time);
  its org, user binding and scopes then decide what is shown, through the same domain calls as
  the API. The console adds no authorisation rule of its own but one: the pipeline pages are
  for a service token or an org token with ``memory:admin`` (see :attr:`Viewer.operator`).
- CSRF: a signed-in form carries HMAC-SHA256(token, "ibex-console-csrf"), which only a page
  rendered for that token can hold (no server secret, so every web process agrees); the
  sign-in form, before any token, uses a double-submit cookie. A missing or wrong one is 403.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qs

import falcon

from memories.auth import AuthError, Principal, resolve_org
from memories.users import ADMIN_SCOPE
from memory_service.http import Api, read_body

COOKIE = "ibex_console"
SIGNIN_COOKIE = "ibex_console_signin"
PATH = "/console"
FORM_LIMIT_BYTES = 16_384
CSRF_FIELD = "csrf"


class Refused(Exception):
    """Answer the console request with an HTML page of this status."""

    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.title = title
        self.message = message


class SignInNeeded(Exception):
    """No valid token: a page request goes to the sign-in form."""


def csrf_of(token: str) -> str:
    return hmac.new(token.encode("utf-8"), b"ibex-console-csrf", hashlib.sha256).hexdigest()


def is_https(req: falcon.Request) -> bool:
    return req.scheme == "https" or req.forwarded_scheme == "https"


def set_cookie(req: falcon.Request, resp: falcon.Response, name: str, value: str) -> None:
    resp.set_cookie(
        name,
        value,
        path=PATH,
        secure=is_https(req),
        http_only=True,
        same_site="Strict",
    )


def clear_cookie(req: falcon.Request, resp: falcon.Response, name: str) -> None:
    resp.unset_cookie(name, path=PATH, same_site="Strict")


def read_form(req: falcon.Request) -> dict[str, str]:
    """A posted form (URL-encoded, at most 16 KiB): the first value of each field."""
    raw = read_body(req, FORM_LIMIT_BYTES)
    try:
        fields = parse_qs(raw.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError:
        raise Refused(400, "Bad request", "the form is not UTF-8") from None
    return {name: values[0] for name, values in fields.items() if values}


def cookie_token(req: falcon.Request) -> str | None:
    values = req.get_cookie_values(COOKIE)
    return values[0] if values else None


@dataclass(frozen=True)
class Viewer:
    """A signed-in token: who it is (never shown) and the org it acts for."""

    principal: Principal
    token: str
    #: The org the pages read; None for a service token that has not named one (``?org=``).
    org_id: uuid.UUID | None
    #: The ``org`` parameter a service token's links carry on; None for an org token.
    org_param: str | None

    @property
    def csrf(self) -> str:
        return csrf_of(self.token)

    @property
    def bound(self) -> uuid.UUID | None:
        """A user-bound token's user: the console shows that person only."""
        return self.principal.user_id

    @property
    def operator(self) -> bool:
        """Sees the pipeline: a service token, or an org token with ``memory:admin`` that is
        not bound to a user (for its own org's dead letters and tokens)."""
        p = self.principal
        return p.is_service or (ADMIN_SCOPE in p.scopes and p.user_id is None)

    def can(self, scope: str) -> bool:
        return scope in self.principal.scopes

    def need(self, scope: str) -> None:
        if not self.can(scope):
            raise Refused(403, "Not allowed", f"this token lacks the {scope} scope")

    def need_org(self) -> uuid.UUID:
        if self.org_id is None:
            raise Refused(400, "Which org?", "a service token names the org: add ?org=<org id>")
        return self.org_id

    def params(self, **extra: object | None) -> dict[str, object | None]:
        """Query parameters for a link: ``extra`` and the org a service token named."""
        return {"org": self.org_param, **extra}

    def check_csrf(self, form: Mapping[str, str]) -> None:
        given = form.get(CSRF_FIELD, "")
        if not hmac.compare_digest(given.encode(), self.csrf.encode()):
            raise Refused(403, "Forbidden", "the form's CSRF token is missing or wrong")


def viewer(api: Api, req: falcon.Request) -> Viewer:
    """The signed-in viewer, or :class:`SignInNeeded`."""
    token = cookie_token(req)
    if not token:
        raise SignInNeeded()
    try:
        principal = api.auth.authenticate(f"Bearer {token}")
    except AuthError:
        raise SignInNeeded() from None
    org_param = req.get_param("org") if principal.is_service else None
    org_id: uuid.UUID | None = None
    if not principal.is_service or org_param:
        try:
            org_id = resolve_org(principal, org_param)
        except AuthError as exc:
            raise Refused(exc.status, "Not allowed", exc.message) from None
    return Viewer(principal, token, org_id, org_param)


def signin_nonce(req: falcon.Request, resp: falcon.Response) -> str:
    """The double-submit value of the sign-in form (a cookie and a hidden field)."""
    values = req.get_cookie_values(SIGNIN_COOKIE)
    nonce = values[0] if values else secrets.token_urlsafe(24)
    set_cookie(req, resp, SIGNIN_COOKIE, nonce)
    return nonce


def check_signin_nonce(req: falcon.Request, form: Mapping[str, str]) -> None:
    values = req.get_cookie_values(SIGNIN_COOKIE)
    given = form.get(CSRF_FIELD, "")
    if not values or not given or not hmac.compare_digest(values[0].encode(), given.encode()):
        raise Refused(403, "Forbidden", "the form's CSRF token is missing or wrong")
