"""The console: HTML pages at ``/console`` on the web process, for a person holding a token.

People, conversations, search and the pipeline, rendered on the server (:mod:`.markup`
escapes every value), no script at all, a Content-Security-Policy that forbids any, a cookie
session with CSRF tokens (:mod:`.session`), and the service's own token check, domain services
and stores behind every page: the console decides nothing about who may see what that the
JSON API does not decide the same way. See docs/console.md.
"""

from __future__ import annotations

from functools import partial

import falcon
import peewee
import redis

from core.config import Settings
from core.prices import PriceTable
from extraction.deadletters import DeadLetterStore
from extraction.queues import queue_counts
from memories.search.service import SearchService
from memories.tokens import TokenStore
from memories.users import UserService
from memory_service.console.conversations import ConversationPage, ConversationsPage
from memory_service.console.deps import ConsoleDeps
from memory_service.console.people import ForgetPerson, PeoplePage, PersonPage
from memory_service.console.pipeline import DiscardAction, PipelinePage, ReplayAction, RevokeAction
from memory_service.console.search import SearchPage
from memory_service.console.signin import Home, SignIn, SignOut, Static
from memory_service.http import Api
from sessions.agents import AgentResolver
from sessions.service import SessionService

PREFIX = "/console"


def add_routes(
    app: falcon.App[falcon.Request, falcon.Response],
    settings: Settings,
    *,
    api: Api,
    db: peewee.Database,
    users: UserService,
    searches: SearchService,
    broker_redis: redis.Redis,
) -> None:
    """The console's routes on ``app``; ``broker_redis``: a client of the broker's Redis (dead
    letters, queue depths)."""
    deps = ConsoleDeps(
        api=api,
        db=db,
        users=users,
        searches=searches,
        sessions=SessionService(db, PriceTable.from_json(settings.llm_prices)),
        agents=AgentResolver(db),
        tokens=TokenStore(db),
        dead_letters=partial(
            DeadLetterStore, db, broker_redis, lease_seconds=settings.extraction_lease_seconds
        ),
        queue_counts=partial(queue_counts, broker_redis),
    )
    app.add_route(PREFIX, Home(deps))
    app.add_route(f"{PREFIX}/signin", SignIn(deps))
    app.add_route(f"{PREFIX}/signout", SignOut(deps))
    app.add_route(f"{PREFIX}/static/{{name}}", Static())
    app.add_route(f"{PREFIX}/people", PeoplePage(deps))
    app.add_route(f"{PREFIX}/person", PersonPage(deps))
    app.add_route(f"{PREFIX}/person/forget", ForgetPerson(deps))
    app.add_route(f"{PREFIX}/conversations", ConversationsPage(deps))
    app.add_route(f"{PREFIX}/conversations/{{session_id:uuid}}", ConversationPage(deps))
    app.add_route(f"{PREFIX}/search", SearchPage(deps))
    app.add_route(f"{PREFIX}/pipeline", PipelinePage(deps))
    app.add_route(f"{PREFIX}/pipeline/replay", ReplayAction(deps))
    app.add_route(f"{PREFIX}/pipeline/discard", DiscardAction(deps))
    app.add_route(f"{PREFIX}/pipeline/revoke", RevokeAction(deps))


__all__ = ["PREFIX", "add_routes"]
