"""Which agent a request names: by slug (``agent``) or by id (``agent_id``), in the caller's org.

Every door that takes an agent resolves it here, so an agent that is not one of the org's gets
the same answer everywhere (:class:`~sessions.errors.AgentNotFoundError`, a 404
``UNKNOWN_AGENT`` over HTTP), as ``ibex search`` says "no agent": a search for a typo is an
error, not an empty list. Runs under row-level security: another org's agent is not found
either.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import peewee

from core.db import tenant, transaction
from sessions.errors import AgentNotFoundError, NoSuchOrgError


class AgentResolver:
    def __init__(self, db: peewee.Database) -> None:
        self.db = db

    def find(
        self, org_id: uuid.UUID, *, slug: str | None = None, agent_id: uuid.UUID | None = None
    ) -> uuid.UUID | None:
        """The id of the org's agent named by ``slug`` or ``agent_id`` (exactly one); None when
        the org has no such agent."""
        if (slug is None) == (agent_id is None):
            raise ValueError("give exactly one of slug and agent_id")
        if slug is not None:
            sql, value = "SELECT id FROM ibex_core.agents WHERE slug = %s", slug
        else:
            sql, value = "SELECT id FROM ibex_core.agents WHERE id = %s", str(agent_id)
        with tenant(self.db, org_id):
            row = self.db.execute_sql(sql, (value,)).fetchone()
        return None if row is None else uuid.UUID(str(row[0]))

    def resolve(
        self, org_id: uuid.UUID, *, slug: str | None = None, agent_id: uuid.UUID | None = None
    ) -> uuid.UUID:
        """As :meth:`find`, raising :class:`AgentNotFoundError` when there is none
        (:class:`NoSuchOrgError` when the org itself has no row: a service token acting for an
        org that was never created)."""
        found = self.find(org_id, slug=slug, agent_id=agent_id)
        if found is None:
            # The org registry is the owner's (a tenant does not list orgs): read as the owner.
            with transaction(self.db):
                org = self.db.execute_sql(
                    "SELECT 1 FROM ibex_core.orgs WHERE id = %s", (str(org_id),)
                ).fetchone()
            if org is None:
                raise NoSuchOrgError()
            raise AgentNotFoundError(slug if slug is not None else str(agent_id))
        return found

    def slug(self, org_id: uuid.UUID, agent_id: uuid.UUID) -> str | None:
        """The slug of the org's agent with this id, or None."""
        with tenant(self.db, org_id):
            row = self.db.execute_sql(
                "SELECT slug FROM ibex_core.agents WHERE id = %s", (str(agent_id),)
            ).fetchone()
        return None if row is None else str(row[0])

    def resolve_body(self, org_id: uuid.UUID, body: Mapping[str, Any]) -> dict[str, Any]:
        """A loaded body naming its agent by ``agent`` or ``agent_id``, with ``agent_id`` the
        resolved id (and ``agent`` left out), for the services that take an id."""
        resolved = {k: v for k, v in body.items() if k != "agent"}
        resolved["agent_id"] = self.resolve(
            org_id, slug=body.get("agent"), agent_id=body.get("agent_id")
        )
        return resolved
