"""The OpenAPI description of the read path (``POST /v1/memories/search``, ``POST
/v1/context``), beside its endpoints."""

from __future__ import annotations

from apispec import APISpec

from memory_service.openapi.parts import (
    ONE_USER,
    ORG_HEADER,
    error,
    exactly_one_of,
    with_org_errors,
)
from schema.search import (
    ContextRequestSchema,
    ContextResultSchema,
    SearchRequestSchema,
    SearchResultSchema,
)


def document(spec: APISpec, secured: list[dict[str, list[str]]], max_body_bytes: int) -> None:
    """Add the read path's routes and their schemas to ``spec``."""
    spec.components.schema("SearchResult", schema=SearchResultSchema)
    spec.components.schema("ContextResult", schema=ContextResultSchema)
    # The rule the schema's validator enforces, which its fields cannot say.
    one_agent = exactly_one_of(agent="string", agent_id="string")
    spec.components.schema(
        "SearchRequest", component={"allOf": [one_agent, ONE_USER]}, schema=SearchRequestSchema
    )
    spec.components.schema(
        "ContextRequest",
        component={
            "allOf": [exactly_one_of(query="string", messages="array"), one_agent, ONE_USER]
        },
        schema=ContextRequestSchema,
    )
    _read_paths(spec, secured, max_body_bytes)


def _read_paths(spec: APISpec, secured: list[dict[str, list[str]]], max_body_bytes: int) -> None:
    """``POST /v1/memories/search`` and ``POST /v1/context``."""
    for path, operation_id, summary, request, result, ok in (
        (
            "/v1/memories/search",
            "searchMemories",
            "Rank an agent's memories for a query (full-text fused with trigram similarity "
            "where pg_trgm is installed and with semantic similarity where an embedder is "
            "configured, the scope's nearest memories by meaning admitted by rank; recency "
            "breaks ties). Each hit has its score, the signals behind it and a highlighted "
            "snippet; min_score keeps the hits that score at least that.",
            "SearchRequest",
            "SearchResult",
            "The hits, best first (at most limit).",
        ),
        (
            "/v1/context",
            "assembleContext",
            "The person's standing facts (chosen without the query; all of their memories "
            "when they fit), then the memories relevant to a query or to the last messages, "
            "packed into a token budget as a <memories> block for a system prompt.",
            "ContextRequest",
            "ContextResult",
            "The block, the memories in it, its estimated tokens and how many were left out.",
        ),
    ):
        spec.path(
            path=path,
            operations={
                "post": {
                    "operationId": operation_id,
                    "summary": summary,
                    "security": secured,
                    "parameters": [ORG_HEADER],
                    "requestBody": {
                        "required": True,
                        "description": f"At most {max_body_bytes} bytes.",
                        "content": {"application/json": {"schema": request}},
                    },
                    "responses": with_org_errors(
                        {
                            "200": {
                                "description": ok,
                                "content": {"application/json": {"schema": result}},
                            },
                            "400": error(
                                "Malformed JSON (MALFORMED_JSON) or header (INVALID_HEADER, "
                                "ORG_REQUIRED)."
                            ),
                            "404": error(
                                "The agent (agent, a slug, or agent_id) is not one of the "
                                "org's (UNKNOWN_AGENT)."
                            ),
                            "413": error(f"Body over {max_body_bytes} bytes (BODY_TOO_LARGE)."),
                            "422": error(
                                "Validation failed, field by field (VALIDATION_FAILED); also "
                                "neither or both of agent and agent_id."
                            ),
                        }
                    ),
                }
            },
        )
