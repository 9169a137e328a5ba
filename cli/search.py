"""``ibex search QUERY --org SLUG --agent SLUG [--user KEY|--all-users] [--limit N] [--json]``:
the search of ``POST /v1/memories/search`` from the command line, straight against Postgres
under the org's row-level security. Whose memories as over HTTP: ``--user`` that user's and the
agent-wide ones (``--no-shared``: the user's only), no user the agent-wide ones only,
``--all-users`` everyone's. A table on a terminal; ``--json`` prints ``{"items": [...]}``, each
item as the HTTP API returns it. An unknown org or agent is an error, never created; an unknown
user has no memories of their own.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import uuid
from typing import Any

from cli.common import EXIT_FAILURE, EXIT_OK
from core.config import Settings
from schema.common import SLUG
from schema.memory import MEMORY_KINDS
from schema.search import MAX_SEARCH_LIMIT

DATABASE = True


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 1 <= value <= MAX_SEARCH_LIMIT:
        raise argparse.ArgumentTypeError(f"must be 1-{MAX_SEARCH_LIMIT}")
    return value


def add_parser(sub: Any) -> None:
    p = sub.add_parser("search", help="search an agent's memories (as POST /v1/memories/search)")
    p.add_argument("query", help="free text: a question, a name, a few words")
    p.add_argument("--org", metavar="SLUG", required=True, help="the org")
    p.add_argument("--agent", metavar="SLUG|ID", required=True, help="the agent, slug or id")
    p.add_argument(
        "--limit", type=_limit, default=10, help=f"hits at most (1-{MAX_SEARCH_LIMIT}, default 10)"
    )
    p.add_argument("--session", metavar="ID", help="only memories from this session id")
    p.add_argument(
        "--kind", action="append", choices=MEMORY_KINDS, help="only this kind (repeatable)"
    )
    who = p.add_mutually_exclusive_group()
    who.add_argument(
        "--user",
        metavar="KEY|ID",
        help="that user's memories and the agent-wide ones (the application's key, or an id)",
    )
    who.add_argument(
        "--all-users", action="store_true", help="every user's memories and the agent-wide ones"
    )
    p.add_argument(
        "--no-shared", action="store_true", help="with --user: leave the agent-wide memories out"
    )
    p.add_argument("--json", action="store_true", help="stable JSON output")


def _fail(message: str) -> int:
    print(f"ibex search: {message}", file=sys.stderr)
    return EXIT_FAILURE


def run(args: argparse.Namespace, settings: Settings) -> int:
    import peewee

    from core.db import make_database
    from embeddings import QueryCache, embedder_from_settings
    from memories.scope import ReadScope
    from memories.search.service import SearchService
    from memories.search.store import SearchStore
    from sessions.store import SessionStore

    if not args.query.split() or "\x00" in args.query:
        return _fail("the query is blank")
    if not SLUG.match(args.org):
        return _fail(f"invalid org slug {args.org!r}")
    session_id = None
    if args.session is not None:
        try:
            session_id = uuid.UUID(args.session)
        except ValueError:
            return _fail(f"{args.session!r} is not a session id")
    db = make_database(settings.require_database_url())
    try:
        org_id = SessionStore(db).find_org(args.org)
        if org_id is None:
            return _fail(f"no org {args.org!r}")
        searches = SearchStore(db)
        agent_id = _agent(searches, org_id, args.agent)
        if agent_id is None:
            return _fail(f"no agent {args.agent!r} in org {args.org!r}")
        scope = ReadScope(all_users=args.all_users)
        if args.user is not None:
            user_id = SessionStore(db).find_user(org_id, args.user)
            if user_id is None:
                user_id = _live_user_id(db, org_id, args.user)
            if user_id is None:
                return _fail(
                    f"no user {args.user!r} in org {args.org!r} (a user is made by their first"
                    " session or memory; leave --user out for the agent-wide memories)"
                )
            scope = ReadScope(user_id=user_id, include_shared=not args.no_shared, named=True)
        embedder = embedder_from_settings(settings)
        found = SearchService(
            searches, QueryCache(embedder) if embedder is not None else None
        ).find(
            org_id,
            agent_id,
            args.query,
            limit=args.limit,
            session_id=session_id,
            kinds=args.kind,
            scope=scope,
        )
        hits = found.hits
    except peewee.ProgrammingError as exc:
        return _fail(f"the database schema is not current ({exc}); run: ibex migrate")
    finally:
        db.close()
    if args.json:
        answer: dict[str, Any] = {"items": [h.as_json() for h in hits]}
        if found.details:
            answer["details"] = found.details
        print(json.dumps(answer, indent=2, sort_keys=True))
        return EXIT_OK
    if not hits:
        print("no memories match")
        return EXIT_OK
    width = max(40, shutil.get_terminal_size((120, 24)).columns - 43)
    for note in found.details.values():
        print(f"note: {note}", file=sys.stderr)
    print(f"{'#':>2}  {'SCORE':>5}  {'TEXT':>5}  {'TRGM':>5}  {'SEM':>5}  {'KIND':10}  CONTENT")
    for rank, hit in enumerate(hits, 1):
        content = " ".join(hit.row.content.split())
        if len(content) > width:
            content = content[: width - 1] + "…"
        print(
            f"{rank:>2}  {hit.score:5.3f}  {hit.text:5.3f}  {hit.trigram:5.3f}"
            f"  {'  -  ' if hit.semantic is None else format(hit.semantic, '5.3f')}"
            f"  {hit.row.kind:10}  {content}"
        )
    return EXIT_OK


def _live_user_id(db: Any, org_id: uuid.UUID, text: str) -> uuid.UUID | None:
    """``text`` as the id of a live user of the org, or None."""
    from core.db import tenant

    try:
        candidate = uuid.UUID(text)
    except ValueError:
        return None
    with tenant(db, org_id):
        row = db.execute_sql(
            "SELECT 1 FROM ibex_core.users WHERE id = %s AND org_id = %s AND deleted_at IS NULL",
            (str(candidate), str(org_id)),
        ).fetchone()
    return candidate if row else None


def _agent(searches: Any, org_id: uuid.UUID, agent: str) -> uuid.UUID | None:
    try:
        candidate = uuid.UUID(agent)
    except ValueError:
        found: uuid.UUID | None = searches.find_agent(org_id, agent) if SLUG.match(agent) else None
        return found
    exists: uuid.UUID | None = searches.agent_exists(org_id, candidate)
    return exists
