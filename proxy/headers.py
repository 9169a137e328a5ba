"""The chat path's ``X-IBEX-*`` headers, read and checked before anything is forwarded.

The proxy does nothing silently: a header it does not know, a value it cannot use, or a set
that would do nothing (a session without an agent, a user without an agent, a budget without
injection) is refused with 400 and the header named, never ignored. The headers (the contract,
docs/operations.md):

- ``X-IBEX-Token``: the IBEX token; ``X-IBEX-Org-ID``: the org a service token acts for.
- ``X-IBEX-Agent`` (slug) and ``X-IBEX-Session-ID`` (external id): record the call as the
  session's next turn.
- ``X-IBEX-User`` (the user's key, as the client's ``user=``) or ``X-IBEX-User-ID`` (the
  user's UUID, as the client's ``user_id=``): whose session and whose memories.
- ``X-IBEX-Memory: inject`` (or ``off``), ``X-IBEX-Memory-Tokens: N``: the context block.
- ``X-IBEX-Session-End: true``: the conversation ends with this call; its session is completed
  once the turn is stored.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from proxy.injection import memory_tokens

#: Every header the proxy reads, as it is documented.
KNOWN_HEADERS = (
    "X-IBEX-Token",
    "X-IBEX-Org-ID",
    "X-IBEX-Agent",
    "X-IBEX-Session-ID",
    "X-IBEX-User",
    "X-IBEX-User-ID",
    "X-IBEX-Memory",
    "X-IBEX-Memory-Tokens",
    "X-IBEX-Session-End",
)
_KNOWN = {name.lower() for name in KNOWN_HEADERS}
MEMORY_VALUES = ("inject", "off")
TRUE_VALUES = ("true", "1", "yes")
FALSE_VALUES = ("false", "0", "no")


class HeaderError(ValueError):
    """A refused set of headers: 400 with ``code`` (``UNKNOWN_HEADER``, ``INVALID_HEADER``,
    ``INCOMPLETE_HEADERS``) and the ``header`` named."""

    def __init__(self, code: str, header: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.header = header
        self.message = message


@dataclass(frozen=True)
class IbexHeaders:
    token: str | None = None
    agent: str | None = None
    external_id: str | None = None
    user: str | None = None
    user_id: uuid.UUID | None = None
    inject: bool = False
    memory_tokens: int = 400
    end: bool = False

    @property
    def records(self) -> bool:
        return self.agent is not None and self.external_id is not None

    def not_recorded(self) -> str:
        """Why a call with these headers records nothing (the ``X-IBEX-Recorded`` value)."""
        if self.agent is None:
            return "no: no X-IBEX-Agent and X-IBEX-Session-ID"
        return "no: no X-IBEX-Session-ID"


def _value(headers: Mapping[str, str], name: str) -> str | None:
    raw = headers.get(name.lower())
    if raw is None:
        return None
    value = raw.strip()
    if not value:
        raise HeaderError("INVALID_HEADER", name, f"{name} is empty")
    return value


def read_headers(headers: Mapping[str, str]) -> IbexHeaders:
    """The call's IBEX headers (``headers``: lower-cased names, as Starlette gives them), or a
    :class:`HeaderError` naming the first one refused."""
    for name in headers:
        if name.lower().startswith("x-ibex-") and name.lower() not in _KNOWN:
            raise HeaderError(
                "UNKNOWN_HEADER",
                name,
                f"unknown header {name}: the chat path reads {', '.join(KNOWN_HEADERS)}",
            )
    token = (headers.get("x-ibex-token") or "").strip() or None
    agent = _value(headers, "X-IBEX-Agent")
    external_id = _value(headers, "X-IBEX-Session-ID")
    user = _value(headers, "X-IBEX-User")
    raw_user_id = _value(headers, "X-IBEX-User-ID")
    memory = _value(headers, "X-IBEX-Memory")
    raw_tokens = _value(headers, "X-IBEX-Memory-Tokens")
    raw_end = _value(headers, "X-IBEX-Session-End")

    if memory is not None and memory.lower() not in MEMORY_VALUES:
        raise HeaderError(
            "INVALID_HEADER",
            "X-IBEX-Memory",
            f"X-IBEX-Memory must be one of {', '.join(MEMORY_VALUES)}, not {memory!r}",
        )
    inject = memory is not None and memory.lower() == "inject"
    user_id = None
    if raw_user_id is not None:
        try:
            user_id = uuid.UUID(raw_user_id)
        except ValueError:
            raise HeaderError(
                "INVALID_HEADER",
                "X-IBEX-User-ID",
                "X-IBEX-User-ID takes the user's id (a UUID); send the application's key of"
                " the user as X-IBEX-User",
            ) from None
    if user is not None and user_id is not None:
        raise HeaderError(
            "INVALID_HEADER", "X-IBEX-User-ID", "send X-IBEX-User or X-IBEX-User-ID, not both"
        )
    end = False
    if raw_end is not None:
        if raw_end.lower() not in TRUE_VALUES + FALSE_VALUES:
            raise HeaderError(
                "INVALID_HEADER", "X-IBEX-Session-End", "X-IBEX-Session-End must be true or false"
            )
        end = raw_end.lower() in TRUE_VALUES
    budget = 400
    if raw_tokens is not None:
        if not inject:
            raise _incomplete("X-IBEX-Memory-Tokens", "X-IBEX-Memory: inject")
        try:
            budget = memory_tokens(raw_tokens)
        except ValueError:
            raise HeaderError(
                "INVALID_HEADER",
                "X-IBEX-Memory-Tokens",
                "X-IBEX-Memory-Tokens must be a positive integer",
            ) from None
    if agent is None:
        for name, given in (
            ("X-IBEX-Session-ID", external_id),
            ("X-IBEX-Memory", inject or None),
            ("X-IBEX-User", user),
            ("X-IBEX-User-ID", user_id),
        ):
            if given is not None:
                raise _incomplete(name, "X-IBEX-Agent")
    elif external_id is None and not inject:
        raise HeaderError(
            "INCOMPLETE_HEADERS",
            "X-IBEX-Agent",
            "X-IBEX-Agent alone does nothing: add X-IBEX-Session-ID to record the call, or"
            " X-IBEX-Memory: inject to add memories",
        )
    if raw_end is not None and external_id is None:
        raise _incomplete("X-IBEX-Session-End", "X-IBEX-Session-ID")
    return IbexHeaders(
        token=token,
        agent=agent,
        external_id=external_id,
        user=user,
        user_id=user_id,
        inject=inject,
        memory_tokens=budget,
        end=end,
    )


def _incomplete(name: str, needs: str) -> HeaderError:
    return HeaderError("INCOMPLETE_HEADERS", name, f"{name} needs {needs}")
