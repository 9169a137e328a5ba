"""Bearer-token lookup without table access: ``ibex_memory.authenticate_token``.

The tenant role authenticates a request before any org is known, yet it may neither read the
token table (every org's hashes) nor stamp a token it does not hold.
"""

from __future__ import annotations

from typing import Any

import peewee
import pytest

from core.db import tenant
from memories.tokens import TokenStore, hash_token
from tests.integration.memory_service.helpers import Tenant


def last_used(db: Any) -> dict[str, Any]:
    rows = db.execute_sql("SELECT id, last_used_at FROM ibex_memory.api_tokens").fetchall()
    return {str(i): t for i, t in rows}


def test_lookup_returns_the_one_row_and_stamps_it_at_most_per_minute(
    db: Any, acme: Tenant, globex: Tenant
) -> None:
    tokens = TokenStore(db)
    assert set(last_used(db).values()) == {None}
    row = tokens.lookup(hash_token(acme.writer))
    assert row is not None
    assert (row.id, row.org_id, row.token_hash) == (
        acme.writer_id,
        acme.org_id,
        hash_token(acme.writer),
    )
    stamped = last_used(db)
    assert stamped[str(acme.writer_id)] is not None
    # No other token, of this org or another, was touched.
    assert [k for k, v in stamped.items() if v is not None] == [str(acme.writer_id)]
    # Within the minute a second lookup does not write again.
    tokens.lookup(hash_token(acme.writer))
    assert last_used(db) == stamped
    # A minute later it does.
    db.execute_sql(
        "UPDATE ibex_memory.api_tokens SET last_used_at = now() - interval '2 minutes'"
        " WHERE id = %s",
        (str(acme.writer_id),),
    )
    before = last_used(db)[str(acme.writer_id)]
    tokens.lookup(hash_token(acme.writer))
    assert last_used(db)[str(acme.writer_id)] > before
    assert tokens.lookup(hash_token("ibex_unknown")) is None


def test_a_revoked_token_is_found_but_not_stamped(db: Any, acme: Tenant) -> None:
    tokens = TokenStore(db)
    tokens.revoke(acme.writer_id)
    row = tokens.lookup(hash_token(acme.writer))
    assert row is not None and row.revoked_at is not None
    assert last_used(db)[str(acme.writer_id)] is None


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT token_hash FROM ibex_memory.api_tokens",
        "SELECT id FROM ibex_memory.api_tokens",
        "UPDATE ibex_memory.api_tokens SET last_used_at = now()",
    ],
)
def test_the_tenant_role_cannot_read_or_stamp_the_table(
    db: Any, acme: Tenant, globex: Tenant, statement: str
) -> None:
    with pytest.raises(peewee.ProgrammingError, match="permission denied"), tenant(db, acme.org_id):
        db.execute_sql(statement)
    assert set(last_used(db).values()) == {None}
