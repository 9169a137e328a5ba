"""Where the memory service is and who calls it by default, and the service's limits the tools
state in their arguments."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

TOOL_NAMES = ("remember", "recall", "context", "forget", "list_memories")
#: ``kind`` of a memory (the API's list; the client's ``MEMORY_KINDS``).
Kind = Literal["fact", "preference", "event", "other"]
#: The service's search limit.
MAX_RECALL = 50
#: Agent slugs resolved and remembered at most (per process, over every token).
MAX_RESOLVED = 1024
#: The service's limit of a memory's content, in characters.
MAX_CONTENT = 4000
#: The service's page size limit.
MAX_PAGE = 200


@dataclass(frozen=True)
class McpConfig:
    """Where the memory service is and who calls it by default.

    ``token`` is used only on stdio (over HTTP each request brings its own); ``agent`` and
    ``user`` are the defaults that a tool's ``agent``/``user`` arguments override.
    """

    url: str
    token: str | None = None
    agent: str | None = None
    user: str | None = None
    timeout: float = 10.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> McpConfig:
        env = os.environ if env is None else env
        return cls(
            url=(env.get("IBEX_URL") or "http://127.0.0.1:8000").rstrip("/"),
            token=env.get("IBEX_TOKEN") or None,
            agent=env.get("IBEX_AGENT") or None,
            user=env.get("IBEX_USER") or None,
        )
