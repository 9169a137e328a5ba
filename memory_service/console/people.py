"""People: an agent's users with their memory counts; one person's current memories by kind,
each with its source turn and the versions it superseded; forgetting a person after a
confirmation. A user-bound token sees its own person only: another person's page is answered
exactly as an unknown person's."""

from __future__ import annotations

import uuid
from typing import Any

import falcon

from memories.scope import ReadScope
from memories.store import MemoryRow
from memory_service.console import reads
from memory_service.console.base import Action, Page
from memory_service.console.markup import Markup, esc, fmt, hidden, join, link, table, url
from memory_service.console.paging import PAGE_SIZE, memory_cursor, next_link, read_cursor
from memory_service.console.session import Refused, Viewer
from sessions.errors import UserNotFoundError

READ = "memory:read"
FORGET = "users:delete"
KINDS = ("fact", "preference", "event", "other")


def no_such_person() -> Refused:
    return Refused(404, "No such person", "no such person for this agent")


def named(req: falcon.Request) -> tuple[str, str]:
    """The agent and the person (the application's key) a person page names."""
    agent, user = req.get_param("agent"), req.get_param("user")
    if not agent or not user:
        raise no_such_person()
    return agent, user


def when(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value is not None else "-"


def agent_of(deps: Any, who: Viewer, req: falcon.Request) -> tuple[uuid.UUID, str, Markup]:
    """The agent the page is about (``agent`` parameter, else the first) and a picker."""
    org_id = who.need_org()
    agents = reads.agents(deps.db, org_id)
    if not agents:
        raise Refused(404, "No agents", "this org has no agent yet")
    wanted = req.get_param("agent")
    chosen = next((a for a in agents if a[1] == wanted), None) if wanted else agents[0]
    if chosen is None:
        raise Refused(404, "No such agent", "this org has no agent of that name")
    picker = join(
        [
            fmt("<strong>{}</strong>", slug)
            if slug == chosen[1]
            else link(url(req.path, who.params(agent=slug)), slug)
            for _, slug in agents
        ],
        " · ",
    )
    return chosen[0], chosen[1], fmt('<p class="agents">Agent: {}</p>', picker)


def source_link(who: Viewer, memory: MemoryRow) -> Markup:
    if memory.session_id is None or memory.turn_index is None:
        return esc("written through the API")
    href = url(
        f"/console/conversations/{memory.session_id}",
        who.params(after=max(memory.turn_index - 1, 0)),
    )
    return link(href + f"#turn-{memory.turn_index}", f"turn {memory.turn_index}")


class PeoplePage(Page):
    def get(self, req: falcon.Request, who: Viewer, **_: Any) -> tuple[str, Markup]:
        who.need(READ)
        org_id = who.need_org()
        agent_id, agent, picker = agent_of(self.deps, who, req)
        after = req.get_param("after")
        rows = reads.people(
            self.deps.db, org_id, agent_id, after=after, limit=PAGE_SIZE + 1, only=who.bound
        )
        page = rows[:PAGE_SIZE]
        table_rows = [
            [
                link(url("/console/person", who.params(agent=agent, user=key)), key),
                count,
            ]
            for _, key, count in page
        ]
        more = (
            next_link(url(req.path, who.params(agent=agent, after=page[-1][1])))
            if len(rows) > PAGE_SIZE
            else Markup("")
        )
        body = picker + table(["person", "current memories"], table_rows, empty="No people yet.")
        return "People", body + more


class PersonPage(Page):
    def get(self, req: falcon.Request, who: Viewer, **_: Any) -> tuple[str, Markup]:
        who.need(READ)
        org_id = who.need_org()
        deps = self.deps
        agent, user = named(req)
        agent_id = deps.agents.find(org_id, slug=agent)
        user_id = deps.users.store.find(org_id, user)
        if agent_id is None or user_id is None or (who.bound and who.bound != user_id):
            raise no_such_person()
        scope = ReadScope(user_id=user_id, include_shared=False, named=True)
        kind = req.get_param("kind")
        if kind is not None and kind not in KINDS:
            raise Refused(400, "Bad request", "kind: one of " + ", ".join(KINDS))
        counts = reads.kind_counts(deps.db, org_id, agent_id, scope)
        base = "/console/person"
        kinds = [
            link(url(base, who.params(agent=agent, user=user)), f"all ({sum(counts.values())})")
        ]
        for name in KINDS:
            label = f"{name} ({counts.get(name, 0)})"
            kinds.append(
                fmt("<strong>{}</strong>", label)
                if name == kind
                else link(url(base, who.params(agent=agent, user=user, kind=name)), label)
            )
        rows = reads.memories(
            deps.db,
            org_id,
            agent_id,
            scope,
            kind=kind,
            after=read_cursor(req),
            limit=PAGE_SIZE + 1,
        )
        page = rows[:PAGE_SIZE]
        history = reads.superseded(deps.db, org_id, [m.id for m in page])
        items = [self._memory(who, m, history.get(m.id, [])) for m in page]
        more = Markup("")
        if len(rows) > PAGE_SIZE:
            cursor = memory_cursor(page[-1])
            more = next_link(
                url(base, who.params(agent=agent, user=user, kind=kind, cursor=cursor))
            )
        actions = Markup("")
        if who.can(FORGET):
            actions = fmt(
                '<p class="actions">{}</p>',
                link(
                    url("/console/person/forget", who.params(agent=agent, user=user)),
                    "Forget this person…",
                    class_="danger",
                ),
            )
        body = (
            fmt('<p class="agents">Agent {}. Kinds: {}</p>', agent, join(kinds, " · "))
            + actions
            + (Markup("".join(items)) if items else esc("No current memories."))
            + more
        )
        return f"Person {user}", body

    def _memory(self, who: Viewer, memory: MemoryRow, older: list[MemoryRow]) -> Markup:
        versions = Markup("")
        if older:
            by_id = {m.id: m for m in [*older, memory]}
            lines = []
            for version in older:
                successor = by_id.get(version.superseded_by) if version.superseded_by else None
                by = source_link(who, successor) if successor is not None else esc("-")
                lines.append(
                    fmt(
                        "<li><q>{}</q> — from {}, superseded {} by {}</li>",
                        version.content,
                        when(version.valid_from or version.created_at),
                        when(version.superseded_at),
                        by,
                    )
                )
            versions = fmt(
                "<details open><summary>History: {} earlier version(s)</summary>"
                '<ol class="history">{}</ol></details>',
                len(older),
                Markup("".join(lines)),
            )
        return fmt(
            '<article class="memory"><p><span class="kind">{}</span> {}</p>'
            '<p class="meta">since {} · source {} · id {}</p>{}</article>',
            memory.kind,
            memory.content,
            when(memory.valid_from or memory.created_at),
            source_link(who, memory),
            memory.id,
            versions,
        )


class ForgetPerson(Page, Action):
    """GET: the confirmation; POST (with the CSRF token): forget the person, their sessions and
    their memories, through the same flow as ``DELETE /v1/users/{user}``."""

    def get(self, req: falcon.Request, who: Viewer, **_: Any) -> tuple[str, Markup]:
        who.need(FORGET)
        agent, user = named(req)
        org_id = who.need_org()
        user_id = self.deps.users.store.find(org_id, user)
        if user_id is None or (who.bound and who.bound != user_id):
            raise no_such_person()
        action = url("/console/person/forget", who.params(agent=agent, user=user))
        body = fmt(
            "<p>Forget <strong>{}</strong>: their sessions and memories are deleted (for"
            " every agent) and their tokens revoked. This cannot be undone from here.</p>"
            '<form method="post" action="{}">{}<button type="submit" class="danger">'
            "Forget {}</button> {}</form>",
            user,
            action,
            hidden("csrf", who.csrf),
            user,
            link(url("/console/person", who.params(agent=agent, user=user)), "Cancel"),
        )
        return "Forget a person?", body

    def post(
        self,
        req: falcon.Request,
        who: Viewer,
        form: dict[str, str],
        **_: Any,
    ) -> str | tuple[str, Markup]:
        who.need(FORGET)
        agent, user = named(req)
        org_id = who.need_org()
        try:
            forgotten = self.deps.users.forget(who.principal, org_id, user)
        except UserNotFoundError:
            raise no_such_person() from None
        body = fmt(
            "<p>Forgot {}: {} session(s) and {} memorie(s) deleted.</p><p>{}</p>",
            user,
            forgotten.sessions,
            forgotten.memories,
            link(url("/console/people", who.params(agent=agent)), "Back to people"),
        )
        return "Forgotten", body
