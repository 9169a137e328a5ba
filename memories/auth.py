"""Bearer authentication: token lookup with a short in-process cache, scopes, org resolution.

Tokens, their hashing and their table are :mod:`memories.tokens`. The database finds the
row by hash, and the hash is compared once more with :func:`hmac.compare_digest`, so nothing
about the stored value leaks through timing. Tokens are never logged: they live in the request
header and in the cache key's hash only.

Valid lookups are cached for ``cache_seconds`` (default 2 s) so a busy writer does not pay a
database round trip per request; a revocation takes effect within that time.
"""

from __future__ import annotations

import hmac
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from memories.tokens import TokenRow, TokenStore, hash_token

CACHE_MAX_ENTRIES = 10_000


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token's identity and rights (never the token itself)."""

    token_id: uuid.UUID
    org_id: uuid.UUID | None
    scopes: frozenset[str]
    is_service: bool
    #: A user-bound token's user (``ibex token create --user``): every route acts as if that
    #: user were named, and another user's rows are not found. None: not bound.
    user_id: uuid.UUID | None = None


class AuthError(Exception):
    """Authentication or authorisation failed; ``status`` and ``code`` say how to answer."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class Authenticator:
    """``clock`` (seconds, monotonic) is a seam: tests pass one they move by hand to expire
    cached lookups without waiting."""

    def __init__(
        self,
        tokens: TokenStore,
        *,
        cache_seconds: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tokens = tokens
        self.cache_seconds = cache_seconds
        self.clock = clock
        self._cache: dict[str, tuple[float, Principal | None]] = {}
        self._lock = threading.Lock()

    def authenticate(self, authorization: str | None) -> Principal:
        """The principal behind an ``Authorization: Bearer ...`` header, or AuthError 401."""
        if not authorization:
            raise AuthError(401, "UNAUTHORIZED", "missing bearer token")
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise AuthError(401, "UNAUTHORIZED", "expected 'Authorization: Bearer <token>'")
        digest = hash_token(token)
        principal = self._cached(digest)
        if principal is None:
            raise AuthError(401, "UNAUTHORIZED", "unknown or revoked token")
        return principal

    def _cached(self, digest: str) -> Principal | None:
        now = self.clock()
        if self.cache_seconds > 0:
            with self._lock:
                hit = self._cache.get(digest)
            if hit is not None and hit[0] > now:
                return hit[1]
        principal = self._load(digest)
        if self.cache_seconds > 0:
            with self._lock:
                if len(self._cache) >= CACHE_MAX_ENTRIES:
                    self._cache.clear()
                self._cache[digest] = (now + self.cache_seconds, principal)
        return principal

    def _load(self, digest: str) -> Principal | None:
        row: TokenRow | None = self.tokens.lookup(digest)
        if row is None or row.revoked_at is not None:
            return None
        if not hmac.compare_digest(row.token_hash.encode(), digest.encode()):
            return None
        return Principal(row.id, row.org_id, frozenset(row.scopes), row.is_service, row.user_id)


def require_scope(principal: Principal, scope: str) -> None:
    if scope not in principal.scopes:
        raise AuthError(403, "INSUFFICIENT_SCOPE", f"this token lacks the {scope} scope")


def resolve_org(principal: Principal, header: str | None) -> uuid.UUID:
    """The org a request acts for: a service token names it in ``X-IBEX-Org-ID``; an org
    token acts for its own org, and naming another one is forbidden. A header that is present
    but empty is malformed, not absent."""
    named: uuid.UUID | None = None
    if header is not None:
        try:
            named = uuid.UUID(header.strip())
        except ValueError:
            raise AuthError(400, "INVALID_HEADER", "X-IBEX-Org-ID must be a UUID") from None
    if principal.is_service:
        if named is None:
            raise AuthError(400, "ORG_REQUIRED", "a service token must name X-IBEX-Org-ID")
        return named
    assert principal.org_id is not None
    if named is not None and named != principal.org_id:
        raise AuthError(403, "FORBIDDEN_ORG", "this token cannot act for that org")
    return principal.org_id
