"""What the console's pages call: the service's own domain objects, built once by
:func:`memory_service.console.add_routes` from what ``create_app`` already has."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import peewee

from extraction.deadletters import DeadLetterStore
from memories.search.service import SearchService
from memories.tokens import TokenStore
from memories.users import UserService
from memory_service.http import Api
from sessions.agents import AgentResolver
from sessions.service import SessionService


@dataclass
class ConsoleDeps:
    api: Api
    db: peewee.Database
    users: UserService
    searches: SearchService
    sessions: SessionService
    agents: AgentResolver
    tokens: TokenStore
    #: The broker's Redis: dead letters (replay as ``ibex dlq replay`` does) and queue depths.
    dead_letters: Callable[[], DeadLetterStore]
    queue_counts: Callable[[Iterable[str]], dict[str, dict[str, int]]] | None
