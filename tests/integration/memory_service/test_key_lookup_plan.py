"""Migration 000025: a keyed write reads its key's index entry, not the org's memories, even
when the plan was made before the table had statistics.

create_memory looks the idempotency key up first, and plpgsql keeps the plan of that statement
from the first calls of a connection. The table is truncated first, so it starts with no
statistics (reltuples -1), as a new database does before autovacuum's first ANALYZE (and for
good on a server without autovacuum). The first keyed writes are made on the empty table, so
the kept plan is the one made there; then the org gets 300 memories, and one more keyed write
must fetch a handful of rows, not the 300: the counters of the write's own transaction
(``pg_stat_xact_user_tables``) say how many rows its index scans fetched.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from memories.store import MemoryStore, NewMemory, WriteOutcome
from tests.integration.memory_service.helpers import Tenant, new_fact

XACT_COUNTS = """
SELECT COALESCE(idx_tup_fetch, 0), COALESCE(seq_scan, 0)
  FROM pg_stat_xact_user_tables
 WHERE schemaname = 'ibex_memory' AND relname = 'memories'
"""


def keyed(acme: Tenant, n: int) -> NewMemory:
    return new_fact(acme.agent_id, f"Keyed memory {n} of the plan test", idempotency_key=f"k-{n}")


@pytest.fixture
def no_autoanalyze(db: Any) -> Iterator[None]:
    """No ANALYZE of memories during the test (a server with autovacuum on could take one
    at any moment), and the table emptied again: a truncated table has no statistics."""
    db.execute_sql("ALTER TABLE ibex_memory.memories SET (autovacuum_enabled = false)")
    db.execute_sql("TRUNCATE ibex_memory.memories CASCADE")
    try:
        yield
    finally:
        db.execute_sql("ALTER TABLE ibex_memory.memories RESET (autovacuum_enabled)")


@pytest.mark.usefixtures("no_autoanalyze")
def test_a_keyed_write_reads_its_key_not_the_orgs_memories(db: Any, acme: Tenant) -> None:
    store = MemoryStore(db)
    (stats,) = db.execute_sql(
        "SELECT reltuples FROM pg_class WHERE oid = 'ibex_memory.memories'::regclass"
    ).fetchone()
    assert stats < 0, "a truncated table has no statistics"
    # Past plpgsql's five custom plans: the plan kept is the one made on the empty table.
    for n in range(8):
        assert store.create(acme.org_id, keyed(acme, n)).outcome is WriteOutcome.CREATED
    for n in range(300):
        result = store.create(acme.org_id, new_fact(acme.agent_id, f"Plain memory {n} here"))
        assert result.outcome is WriteOutcome.CREATED
    with db.atomic():
        fetched_before, scans_before = db.execute_sql(XACT_COUNTS).fetchone()
        result = store.create(acme.org_id, keyed(acme, 1000))
        fetched_after, scans_after = db.execute_sql(XACT_COUNTS).fetchone()
    assert result.outcome is WriteOutcome.CREATED
    # The key lookup (none found), the insert's read-back of its row: a few rows, whatever
    # the org holds. Read through idx_memories_session it was every one of the 308.
    assert fetched_after - fetched_before < 20, (fetched_before, fetched_after)
    assert scans_after == scans_before
    # A repeat of a stored key is still found (the lookup answers, not the insert's conflict).
    again = store.create(acme.org_id, keyed(acme, 3))
    assert again.outcome is WriteOutcome.KEY_EXISTS
