"""The usage routes: ``GET /v1/usage`` and ``GET /v1/budget`` (scope ``usage:read``, or
``memory:admin``).

What the caller's org spent on extraction, from the usage ledger (:mod:`extraction.usage`):
turns, LLM calls, input, output and embedding tokens and their cost, in total, per model and
per UTC day, and the org's turns by state; and its token budget (:mod:`extraction.budgets`).
Org-wide figures: a user-bound token is refused (403), whatever its scopes.
"""

from __future__ import annotations

import falcon

from extraction.budgets import BudgetStore, budget_json
from extraction.usage import UsageReader
from memories.auth import Principal
from memory_service.errors import ErrorAnswer
from memory_service.http import Api, authenticate, load_or_422, query_params, respond_json
from schema.usage import UsageQuerySchema

USAGE_READ = "usage:read"
ADMIN = "memory:admin"
QUERY = UsageQuerySchema()


def require_org_reader(principal: Principal) -> None:
    """``usage:read`` or ``memory:admin``, and not bound to a user: the figures are org-wide."""
    if not {USAGE_READ, ADMIN} & set(principal.scopes):
        raise ErrorAnswer(403, "INSUFFICIENT_SCOPE", f"this token lacks the {USAGE_READ} scope")
    if principal.user_id is not None:
        raise ErrorAnswer(
            403, "INSUFFICIENT_SCOPE", "usage is org-wide: a user-bound token may not read it"
        )


class UsageResource:
    def __init__(self, api: Api, reader: UsageReader) -> None:
        self.api = api
        self.reader = reader

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        principal, org_id = authenticate(self.api, req, None)
        require_org_reader(principal)
        query = load_or_422(QUERY, query_params(req))
        summary = self.reader.summary(org_id, query.get("since"))
        respond_json(resp, 200, summary.as_json(str(org_id)))


class BudgetResource:
    def __init__(self, api: Api, budgets: BudgetStore) -> None:
        self.api = api
        self.budgets = budgets

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        principal, org_id = authenticate(self.api, req, None)
        require_org_reader(principal)
        respond_json(resp, 200, budget_json(self.budgets.get(org_id)))


def add_routes(
    app: falcon.App[falcon.Request, falcon.Response],
    api: Api,
    reader: UsageReader,
    budgets: BudgetStore,
) -> None:
    app.add_route("/v1/usage", UsageResource(api, reader))
    app.add_route("/v1/budget", BudgetResource(api, budgets))


__all__ = ["USAGE_READ", "BudgetResource", "UsageResource", "add_routes"]
