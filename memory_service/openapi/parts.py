"""The pieces every route's OpenAPI description shares: error answers and the org header.

Each domain's part (``memory_service/<domain>/openapi.py``) builds on them and
:mod:`memory_service.openapi.document` puts the parts together.
"""

from __future__ import annotations

from typing import Any


def error(description: str, **headers: Any) -> dict[str, Any]:
    """An error answer: its description and the common error body."""
    response: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": "Error"}},
    }
    if headers:
        response["headers"] = headers
    return response


RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before retrying.",
        "schema": {"type": "integer", "minimum": 0},
    }
}
WWW_AUTHENTICATE = {"WWW-Authenticate": {"schema": {"type": "string"}}}

AUTH_ERRORS = {
    "401": error("Missing, unknown or revoked token (UNAUTHORIZED).", **WWW_AUTHENTICATE),
    "403": error(
        "The token lacks the scope (INSUFFICIENT_SCOPE; all_users needs memory:admin) or the"
        " org (FORBIDDEN_ORG), or a user-bound token named another user or all_users"
        " (FORBIDDEN_USER)."
    ),
}
COMMON_ERRORS = {
    "500": error("Unexpected error (INTERNAL_ERROR)."),
    "503": error(
        "Postgres unavailable (UNAVAILABLE, with Retry-After), or its schema is not current"
        " (SCHEMA_NOT_READY: the message names the database and says to run `ibex migrate`).",
        **RETRY_AFTER,
    ),
}


def with_org_errors(responses: dict[str, Any]) -> dict[str, Any]:
    """``responses`` and the errors every authenticated route that takes an org can answer."""
    responses.setdefault(
        "400",
        error(
            "Malformed or empty X-IBEX-Org-ID (INVALID_HEADER) or none with a service token "
            "(ORG_REQUIRED)."
        ),
    )
    return {**responses, **AUTH_ERRORS, **COMMON_ERRORS}


def exactly_one_of(**types: str) -> dict[str, Any]:
    """A schema's rule that exactly one of the named properties is given (and not null), each
    of the given JSON type: ``exactly_one_of(query="string", messages="array")``."""
    return {
        "oneOf": [
            {"required": [name], "properties": {name: {"type": kind}}}
            for name, kind in types.items()
        ]
    }


def _given(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": [name], "properties": {name: schema}}


#: The user fields' rule (schema.users.check_one_user) for a body: not both ``user`` and
#: ``user_id``, and neither with ``all_users: true``. (Query parameters cannot state it.)
ONE_USER: dict[str, Any] = {
    "allOf": [
        {
            "not": {
                "allOf": [_given("user", {"type": "string"}), _given("user_id", {"type": "string"})]
            }
        },
        {
            "not": {
                "allOf": [
                    _given("all_users", {"enum": [True]}),
                    {
                        "anyOf": [
                            _given("user", {"type": "string"}),
                            _given("user_id", {"type": "string"}),
                        ]
                    },
                ]
            }
        },
    ]
}


UNKNOWN_AGENT = error("The agent named is not one of the org's (UNKNOWN_AGENT).")

#: A header value as the service accepts it: printable (no control character, no
#: non-breaking space or soft hyphen, as ``str.isprintable``), not blank at either end.
PRINTABLE = "[\\u0021-\\u007e\\u00a1-\\u00ac\\u00ae-\\u00ff]"
PRINTABLE_HEADER_PATTERN = (
    f"^{PRINTABLE}([\\u0020-\\u007e\\u00a1-\\u00ac\\u00ae-\\u00ff]*{PRINTABLE})?$"
)


def null_only_alternatives(node: Any) -> Any:
    """``node`` (a document, in place) with apispec's alternative for a nullable nested schema,
    ``{"type": "object", "nullable": true}`` (any object at all), made to mean null only."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "anyOf" and isinstance(value, list):
                for i, option in enumerate(value):
                    if option == {"type": "object", "nullable": True}:
                        value[i] = {"type": "object", "nullable": True, "enum": [None]}
            null_only_alternatives(value)
    elif isinstance(node, list):
        for item in node:
            null_only_alternatives(item)
    return node


ORG_HEADER = {
    "in": "header",
    "name": "X-IBEX-Org-ID",
    "required": False,
    "description": "The org to act for: required with a service token; an org token may "
    "only name its own org.",
    "schema": {"type": "string", "format": "uuid"},
}
