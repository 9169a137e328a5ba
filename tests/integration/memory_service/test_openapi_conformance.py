"""The OpenAPI document states every constraint the code enforces: schemathesis, generating
requests for every operation both valid by the document (positive) and not (negative), finds
no server error, no valid request refused (ST202) and no invalid one accepted (ST201), among
the other stateless checks. In-process, over the real Postgres and Redis."""

from __future__ import annotations

import contextlib
import datetime as dt
import re
from collections import Counter
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode, checks
from schemathesis.config import SchemathesisConfig
from schemathesis.core.failures import Failure, FailureGroup

from memory_service.cursor import encode_cursor, encode_turn_cursor
from schema.memory import CURSOR_FORMAT
from schema.sessions import TURN_CURSOR_FORMAT
from sessions.store import SessionStore
from tests.conftest import examples
from tests.integration.memory_service.helpers import Tenant, make_token

#: A cursor is opaque (the document says so with its own format): the valid ones are those the
#: service makes, for any position.
CURSORS = st.builds(
    encode_cursor, st.datetimes(timezones=st.just(dt.UTC)).filter(lambda d: d.year > 1), st.uuids()
)
#: The turns list's cursor (its own format): a turn index.
TURN_CURSORS = st.builds(encode_turn_cursor, st.integers(min_value=0, max_value=2**31 - 1))
#: Every body over the body limit is 413 BODY_TOO_LARGE, as documented: a limit in bytes of
#: the serialized body, which no JSON Schema keyword can state.
CONFIG = SchemathesisConfig.from_dict(
    {
        "generation": {"allow-x00": False},
        "checks": {
            name: {"expected-statuses": [*statuses, "413"]}
            for name, statuses in (
                ("positive_data_acceptance", ["2xx", "3xx", "401", "403", "404", "409", "429"]),
                (
                    "negative_data_rejection",
                    ["400", "401", "403", "404", "405", "406", "409", "415", "422", "428"],
                ),
            )
        },
    }
)

#: The rules OpenAPI 3.0 cannot state, which the document states in words; these refusals
#: are the only ones let through. The keys a message of a turn carries verbatim besides
#: ``role`` and ``content`` must not hold control characters (3.0 has no ``propertyNames``);
#: a session's external id and its user, given both in the body and in the X-IBEX-Session-ID
#: and X-IBEX-User-ID headers, must be the same in both, and the turns of one append must be
#: consecutive (rules across values). NUL, refused in every string and key, is not generated
#: (``allow-x00``): in the keys of free-form objects no 3.0 keyword can refuse it.
UNSTATABLE = (
    "a key contains a control character",
    "differs from the X-IBEX-Session-ID header",
    "differs from the X-IBEX-User-ID header",
    "must follow the previous turn's index by one",
)

#: Rules across query parameters, which OpenAPI 3.0 cannot state for them (bodies state them
#: with ``not``): user and user_id are exclusive, and neither goes with all_users.
UNSTATABLE_IN_QUERIES = (
    "give user or user_id, not both",
    "all_users reads every user: do not name one",
)

CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
    checks.positive_data_acceptance,  # ST202
    checks.negative_data_rejection,  # ST201
]


_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def _is_uuid(value: object) -> bool:
    """A UUID as the document's ``format: uuid`` has it (a value that only Python's parser
    takes, such as one without hyphens, is a negative case: it is left as generated)."""
    return isinstance(value, str) and _UUID.fullmatch(value) is not None


def test_schemathesis_finds_no_rejected_valid_or_accepted_invalid_request(
    app: Any, acme: Tenant, db: Any
) -> None:
    scopes = ["memory:read", "memory:write", "sessions:read", "sessions:write"]
    token = make_token(db, None, scopes)[0]
    # A made-up user id is an unknown user, which no schema can state: bodies name acme's.
    user_id = SessionStore(db, bind_models=False).resolve_user(acme.org_id, external_id="fuzz")
    schemathesis.openapi.format(CURSOR_FORMAT, CURSORS)
    schemathesis.openapi.format(TURN_CURSOR_FORMAT, TURN_CURSORS)
    schema = schemathesis.openapi.from_wsgi("/openapi.json", app, config=CONFIG)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10
    failures: Counter[tuple[str, str, str, int]] = Counter()
    answered: Counter[str] = Counter()
    samples: dict[tuple[str, str, str, int], str] = {}
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=examples(30),
                deadline=None,
                database=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
            )
            def run(case: Any) -> None:
                # The service token acts for acme: a well-formed org header names acme (another
                # org, existing or not, is a 403 that says nothing of the document).
                headers = {"Authorization": f"Bearer {token}"}
                named = (case.headers or {}).get("X-IBEX-Org-ID")
                if named is None or _is_uuid(named):
                    headers["X-IBEX-Org-ID"] = str(acme.org_id)
                if isinstance(case.body, dict) and _is_uuid(case.body.get("agent_id")):
                    case.body["agent_id"] = str(acme.agent_id)
                if isinstance(case.body, dict) and _is_uuid(case.body.get("user_id")):
                    case.body["user_id"] = str(user_id)
                supersedes = case.body.get("supersedes") if isinstance(case.body, dict) else None
                if isinstance(supersedes, list) and all(_is_uuid(i) for i in supersedes):
                    # Made-up ids name no current memory, which no schema can state.
                    case.body["supersedes"] = []
                source = case.body.get("source") if isinstance(case.body, dict) else None
                if isinstance(source, dict) and _is_uuid(source.get("session_id")):
                    source["session_id"] = str(acme.session_id)  # acme's, not made up
                response = case.call(headers=headers)
                if any(rule in response.text for rule in UNSTATABLE):
                    return
                # The methods whose user fields are query parameters: the reads, and the
                # memory delete (which reads its memory in the caller's user scope first).
                if case.operation.method.upper() in ("GET", "DELETE") and any(
                    rule in response.text for rule in UNSTATABLE_IN_QUERIES
                ):
                    return
                try:
                    case.validate_response(response, checks=CHECKS, headers=headers)
                except (Failure, FailureGroup) as exc:
                    found = exc.exceptions if isinstance(exc, FailureGroup) else (exc,)
                    for failure in found:
                        status = getattr(failure, "status_code", 0) or 0
                        key = (
                            case.operation.label,
                            str(case.meta.generation.mode.value),
                            failure.code,
                            status,
                        )
                        failures[key] += 1
                        samples.setdefault(key, f"{case.as_curl_command()}\n{response.text[:300]}")
                    return
                answered[case.operation.label] += 1
                assert response.status_code < 500

            if mode is GenerationMode.NEGATIVE:
                # An operation with no parameter and no body has nothing to get wrong.
                with contextlib.suppress(Unsatisfiable):
                    run()
            else:
                run()
    report = "\n\n".join(f"{key} x{n}\n{samples[key]}" for key, n in failures.items())
    assert not failures, report
    assert len(answered) == len(operations), answered
