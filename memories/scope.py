"""Whose memories a request sees or writes: the user a request names, and a read's scope.

Pure values, no I/O. A request names a user by the application's key (``user``) or by id
(``user_id``), or by neither; a user-bound token names its own user whatever the request says
(:class:`~memories.users.UserService` resolves and checks both). A read's
:class:`ReadScope` is then a condition on ``memories.user_id``:

- a user: that user's memories and the agent-wide ones (``user_id IS NULL``), or that user's
  alone with ``include_shared: false``;
- no user: the agent-wide memories only, never another person's;
- ``all_users: true`` (scope ``memory:admin``): every memory of the agent.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: The header that may carry the user (its key) on the sessions API.
USER_HEADER = "X-IBEX-User-ID"


@dataclass(frozen=True)
class UserRef:
    """The user a request names: by key, by id, or none (both None)."""

    key: str | None = None
    id: uuid.UUID | None = None

    @property
    def named(self) -> bool:
        return self.key is not None or self.id is not None

    @classmethod
    def of(cls, loaded: Mapping[str, Any]) -> UserRef:
        """From a loaded body or query with ``user`` and ``user_id`` (at most one set)."""
        return cls(key=loaded.get("user"), id=loaded.get("user_id"))


@dataclass(frozen=True)
class ReadScope:
    """Whose memories a read sees (see the module docstring)."""

    all_users: bool = False
    #: The user whose memories are read; None with ``named``: a key no live user has (so
    #: none of their memories exist), and without ``named``: no user (agent-wide only).
    user_id: uuid.UUID | None = None
    include_shared: bool = True
    named: bool = False

    @property
    def empty(self) -> bool:
        """Nothing can match: a user with no row, without the agent-wide memories."""
        return self.named and self.user_id is None and not self.include_shared

    @property
    def shared(self) -> bool:
        """Whether the agent-wide memories are in the scope."""
        return self.include_shared or not self.named

    def condition(self, column: str = "user_id") -> tuple[str, list[Any]]:
        """The scope as SQL on ``column`` with its parameters."""
        if self.all_users:
            return "true", []
        if self.user_id is not None and self.shared:
            return f"({column} = %s OR {column} IS NULL)", [str(self.user_id)]
        if self.user_id is not None:
            return f"{column} = %s", [str(self.user_id)]
        if self.shared:
            return f"{column} IS NULL", []
        return "false", []


#: The scope of a read that names no user: the agent-wide memories.
AGENT_WIDE = ReadScope()
