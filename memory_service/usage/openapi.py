"""The OpenAPI description of the usage route (:mod:`memory_service.usage`), added to the
service's document by :func:`memory_service.openapi.document.build_spec`."""

from __future__ import annotations

from apispec import APISpec

from memory_service.openapi.parts import ORG_HEADER, error, with_org_errors
from schema.usage import BudgetSchema, UsageQuerySchema, UsageSchema


def document(spec: APISpec, secured: list[dict[str, list[str]]]) -> None:
    """Add ``GET /v1/usage`` and ``GET /v1/budget`` to ``spec``."""
    spec.components.schema("Usage", schema=UsageSchema)
    spec.components.schema("Budget", schema=BudgetSchema)
    spec.path(
        path="/v1/budget",
        operations={
            "get": {
                "operationId": "getBudget",
                "summary": "The org's token budget: limit per period (month or day, UTC),"
                " tokens used this period, and the turns waiting for it.",
                "description": "Scope usage:read (or memory:admin); a user-bound token is 403."
                " Set with `ibex budget set`; limit is null when the org has none. Over it, the"
                " org's turns wait (state waiting_for_budget) with no LLM call and resume by"
                " themselves when it is raised or the period turns.",
                "security": secured,
                "parameters": [ORG_HEADER],
                "responses": with_org_errors(
                    {
                        "200": {
                            "description": "The org's budget.",
                            "content": {"application/json": {"schema": "Budget"}},
                        },
                    }
                ),
            }
        },
    )
    spec.path(
        path="/v1/usage",
        operations={
            "get": {
                "operationId": "getUsage",
                "summary": "What the org's extraction cost: turns, LLM calls, tokens and cost"
                " (USD, by the price table), in total, per model and per UTC day.",
                "description": "Scope usage:read (or memory:admin); a user-bound token is 403"
                " (the figures are org-wide). Each turn is counted once, with its persisted"
                " result, whatever the retries.",
                "security": secured,
                "parameters": [ORG_HEADER, {"in": "query", "schema": UsageQuerySchema}],
                "responses": with_org_errors(
                    {
                        "200": {
                            "description": "The org's usage.",
                            "content": {"application/json": {"schema": "Usage"}},
                        },
                        "422": error("Invalid query parameter (VALIDATION_FAILED)."),
                    }
                ),
            }
        },
    )
