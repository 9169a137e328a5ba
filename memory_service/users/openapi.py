"""The OpenAPI description of the users route (:mod:`memory_service.users`), added to the
service's document by :func:`memory_service.openapi.document.build_spec`."""

from __future__ import annotations

from apispec import APISpec

from memory_service.openapi.parts import ORG_HEADER, error, with_org_errors
from schema.users import MAX_USER_KEY_CHARS, ForgottenUserSchema

USER = {
    "in": "path",
    "name": "user",
    "required": True,
    "description": "The application's key for the person, or the user's id.",
    "schema": {"type": "string", "minLength": 1, "maxLength": MAX_USER_KEY_CHARS},
}


def document(spec: APISpec, secured: list[dict[str, list[str]]]) -> None:
    """Add ``DELETE /v1/users/{user}`` to ``spec``."""
    spec.components.schema("ForgottenUser", schema=ForgottenUserSchema)
    spec.path(
        path="/v1/users/{user}",
        operations={
            "delete": {
                "operationId": "forgetUser",
                "summary": "Forget a user (scope users:delete): the user, their sessions and"
                " their memories are soft-deleted and their tokens revoked, in one transaction.",
                "description": "From this answer on, no read returns their memories; `ibex prune"
                " --deleted-older-than` erases the rows later. A user-bound token may forget"
                " its own user only (another one is 404).",
                "security": secured,
                "parameters": [USER, ORG_HEADER],
                "responses": with_org_errors(
                    {
                        "200": {
                            "description": "Forgotten.",
                            "content": {"application/json": {"schema": "ForgottenUser"}},
                        },
                        "404": error("No such live user in this org (NOT_FOUND)."),
                    }
                ),
            }
        },
    )
