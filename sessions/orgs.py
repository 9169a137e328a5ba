"""Orgs and agents: every statement that writes ``ibex_core.orgs`` and ``ibex_core.agents``.

An org is created by the owner role (the registry is not tenant data: a slug is resolved
before a tenant transaction); an agent in the org's tenant transaction. Both in the caller's
transaction.
"""

from __future__ import annotations

import uuid

import peewee


def upsert_org(db: peewee.Database, slug: str) -> uuid.UUID:
    """The id of the org with ``slug``, inserted when missing, in the current transaction."""
    row = db.execute_sql(
        "INSERT INTO ibex_core.orgs (slug) VALUES (%s) ON CONFLICT (slug) DO NOTHING RETURNING id",
        (slug,),
    ).fetchone()
    if row is None:
        row = db.execute_sql("SELECT id FROM ibex_core.orgs WHERE slug = %s", (slug,)).fetchone()
    return uuid.UUID(str(row[0]))


def select_org(db: peewee.Database, slug: str) -> uuid.UUID | None:
    """The id of the org with ``slug``, or None: never creates one."""
    row = db.execute_sql("SELECT id FROM ibex_core.orgs WHERE slug = %s", (slug,)).fetchone()
    return uuid.UUID(str(row[0])) if row else None


def upsert_agent(db: peewee.Database, org_id: uuid.UUID, slug: str) -> uuid.UUID:
    """The id of the org's agent with ``slug``, inserted when missing, in the current tenant
    transaction."""
    row = db.execute_sql(
        "INSERT INTO ibex_core.agents (org_id, slug) VALUES (%s, %s)"
        " ON CONFLICT (org_id, slug) DO NOTHING RETURNING id",
        (str(org_id), slug),
    ).fetchone()
    if row is None:
        row = db.execute_sql(
            "SELECT id FROM ibex_core.agents WHERE org_id = %s AND slug = %s",
            (str(org_id), slug),
        ).fetchone()
    return uuid.UUID(str(row[0]))
