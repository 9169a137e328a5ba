"""Token authentication, its cache, scopes and org resolution (a fake token store, no I/O)."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from memories.auth import (
    Authenticator,
    AuthError,
    Principal,
    require_scope,
    resolve_org,
)
from memories.tokens import TokenRow, generate_token, hash_token

ORG = uuid.UUID("11111111-1111-4111-8111-111111111111")
OTHER = uuid.UUID("22222222-2222-4222-8222-222222222222")


class FakeTokens:
    def __init__(self) -> None:
        self.rows: dict[str, TokenRow] = {}
        self.lookups = 0

    def add(self, token: str, org_id: uuid.UUID | None, scopes: tuple[str, ...]) -> TokenRow:
        row = TokenRow(
            uuid.uuid4(),
            org_id,
            None,
            hash_token(token),
            token[:12],
            scopes,
            org_id is None,
            dt.datetime.now(dt.UTC),
            None,
            None,
        )
        self.rows[row.token_hash] = row
        return row

    def revoke(self, token: str) -> None:
        row = self.rows[hash_token(token)]
        self.rows[row.token_hash] = TokenRow(
            **{**row.__dict__, "revoked_at": dt.datetime.now(dt.UTC)}
        )

    def lookup(self, token_hash: str) -> TokenRow | None:
        self.lookups += 1
        return self.rows.get(token_hash)


def test_tokens_are_random_and_hashed() -> None:
    a, b = generate_token(), generate_token()
    assert a != b and a.startswith("ibex_") and len(a) >= 45
    assert hash_token(a) != a and len(hash_token(a)) == 64


@pytest.mark.parametrize("header", [None, "", "Bearer", "Token abc", "Bearer    "])
def test_malformed_headers_are_401(header: str | None) -> None:
    with pytest.raises(AuthError) as info:
        Authenticator(FakeTokens()).authenticate(header)  # type: ignore[arg-type]
    assert (info.value.status, info.value.code) == (401, "UNAUTHORIZED")


def test_lookup_is_cached_and_revocation_lands_after_the_cache_time() -> None:
    tokens = FakeTokens()
    token = generate_token()
    tokens.add(token, ORG, ("memory:read",))
    now = [100.0]
    auth = Authenticator(tokens, cache_seconds=0.2, clock=lambda: now[0])  # type: ignore[arg-type]
    principal = auth.authenticate(f"Bearer {token}")
    assert principal.org_id == ORG and principal.scopes == {"memory:read"}
    now[0] += 0.19
    auth.authenticate(f"bearer {token}")
    assert tokens.lookups == 1
    tokens.revoke(token)
    auth.authenticate(f"Bearer {token}")  # still cached: the revocation is not seen yet
    assert tokens.lookups == 1
    now[0] += 0.02
    with pytest.raises(AuthError):
        auth.authenticate(f"Bearer {token}")
    assert tokens.lookups == 2


def test_unknown_tokens_are_401_and_not_cached_forever() -> None:
    tokens = FakeTokens()
    auth = Authenticator(tokens, cache_seconds=0)  # type: ignore[arg-type]
    token = generate_token()
    with pytest.raises(AuthError):
        auth.authenticate(f"Bearer {token}")
    tokens.add(token, ORG, ("memory:write",))
    assert auth.authenticate(f"Bearer {token}").org_id == ORG


def test_scope() -> None:
    principal = Principal(uuid.uuid4(), ORG, frozenset({"memory:read"}), False)
    require_scope(principal, "memory:read")
    with pytest.raises(AuthError) as info:
        require_scope(principal, "memory:write")
    assert (info.value.status, info.value.code) == (403, "INSUFFICIENT_SCOPE")


def test_org_resolution() -> None:
    org_token = Principal(uuid.uuid4(), ORG, frozenset(), False)
    service = Principal(uuid.uuid4(), None, frozenset(), True)
    assert resolve_org(org_token, None) == ORG
    assert resolve_org(org_token, str(ORG).upper()) == ORG
    assert resolve_org(service, str(OTHER)) == OTHER
    for principal, header, expected in [
        (org_token, str(OTHER), (403, "FORBIDDEN_ORG")),
        (org_token, "acme", (400, "INVALID_HEADER")),
        (service, None, (400, "ORG_REQUIRED")),
        # Present but empty is malformed, not absent, for either kind of token.
        (service, "", (400, "INVALID_HEADER")),
        (service, " ", (400, "INVALID_HEADER")),
        (org_token, "", (400, "INVALID_HEADER")),
        (service, "nope", (400, "INVALID_HEADER")),
    ]:
        with pytest.raises(AuthError) as info:
            resolve_org(principal, header)
        assert (info.value.status, info.value.code) == expected
