"""Conversations: sessions by agent, person and status; one session's turns as recorded, each
with its extraction state and usage (the sessions API's read-back) and the memories it
produced. A user-bound
token sees its own person's sessions only: another session is answered as an unknown one."""

from __future__ import annotations

import json
import uuid
from typing import Any

import falcon

from memory_service.console import reads
from memory_service.console.base import Page
from memory_service.console.markup import Markup, esc, fmt, join, link, table, url
from memory_service.console.paging import PAGE_SIZE, int_param, next_link, read_cursor
from memory_service.console.people import when
from memory_service.console.session import Refused, Viewer
from memory_service.cursor import encode_cursor
from sessions.errors import SessionNotFoundError
from sessions.readback import RecordedTurn, TurnUsage

READ = "sessions:read"
STATUSES = ("active", "completed", "abandoned")


def no_such_session() -> Refused:
    return Refused(404, "No such conversation", "no such conversation")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        parts = [p.get("text") if isinstance(p, dict) else None for p in content]
        if all(isinstance(p, str) for p in parts):
            return "\n".join(p for p in parts if isinstance(p, str))
    return json.dumps(content, ensure_ascii=False, sort_keys=True)


def _options(name: str, values: list[str], chosen: str | None, blank: str) -> Markup:
    items = [fmt('<option value="">{}</option>', blank)]
    for value in values:
        if value == chosen:
            items.append(fmt('<option value="{}" selected>{}</option>', value, value))
        else:
            items.append(fmt('<option value="{}">{}</option>', value, value))
    return fmt('<select name="{}">{}</select>', name, Markup("".join(items)))


class ConversationsPage(Page):
    def get(self, req: falcon.Request, who: Viewer, **_: Any) -> tuple[str, Markup]:
        who.need(READ)
        org_id = who.need_org()
        deps = self.deps
        agents = reads.agents(deps.db, org_id)
        slugs = {agent_id: slug for agent_id, slug in agents}
        agent = req.get_param("agent") or None
        user = req.get_param("user") or None
        status = req.get_param("status") or None
        if status is not None and status not in STATUSES:
            raise Refused(400, "Bad request", "status: one of " + ", ".join(STATUSES))
        agent_id = next((i for i, s in slugs.items() if s == agent), None)
        owner = who.bound
        empty = agent is not None and agent_id is None
        if user is not None:
            user_id = deps.users.store.find(org_id, user)
            # Another person's key reads as an unknown one: an empty list.
            empty = empty or user_id is None or (owner is not None and owner != user_id)
            owner = user_id
        infos = []
        if not empty:
            infos = deps.sessions.list(
                org_id,
                agent_id=agent_id,
                external_id=None,
                status=status,
                limit=PAGE_SIZE + 1,
                after=read_cursor(req),
                owner=owner,
            )
        page = infos[:PAGE_SIZE]
        rows = []
        for info in page:
            s, p = info.session, info.progress
            rows.append(
                [
                    link(url(f"/console/conversations/{s.id}", who.params()), s.external_id),
                    slugs.get(uuid.UUID(str(s.agent_id)), "?"),
                    s.status,
                    s.turn_count,
                    fmt("{} done · {} pending · {} failed", p.done, p.pending, p.failed),
                    p.pointer,
                    when(s.created_at),
                ]
            )
        form = fmt(
            '<form method="get" action="/console/conversations" class="filters">{}'
            '<label>Agent {}</label> <label>Person <input name="user" value="{}"></label> '
            '<label>Status {}</label> <button type="submit">Show</button></form>',
            Markup(
                fmt('<input type="hidden" name="org" value="{}">', who.org_param)
                if who.org_param
                else ""
            ),
            _options("agent", [s for _, s in agents], agent, "every agent"),
            user or "",
            _options("status", list(STATUSES), status, "any status"),
        )
        more = Markup("")
        if len(infos) > PAGE_SIZE:
            last = page[-1].session
            cursor = encode_cursor(last.created_at, uuid.UUID(str(last.id)))
            params = who.params(agent=agent, user=user, status=status, cursor=cursor)
            more = next_link(url("/console/conversations", params))
        headers = ["conversation", "agent", "status", "turns", "extraction", "pointer", "started"]
        return "Conversations", form + table(headers, rows, empty="No conversations.") + more


class ConversationPage(Page):
    def get(
        self, req: falcon.Request, who: Viewer, session_id: uuid.UUID | None = None, **_: Any
    ) -> tuple[str, Markup]:
        who.need(READ)
        org_id = who.need_org()
        assert session_id is not None
        deps = self.deps
        try:
            info = deps.sessions.info(org_id, session_id, who.bound)
        except SessionNotFoundError:
            raise no_such_session() from None
        session, progress = info.session, info.progress
        after = int_param(req, "after")
        first, last = after + 1, min(after + PAGE_SIZE, session.turn_count)
        turns = reads.turns(deps.db, org_id, session_id, first, last)
        # Reachable (info above): each turn's state and usage as the turns route reads them.
        states = {
            t.turn_index: t
            for t in deps.sessions.reader.turns(org_id, session_id, after=after, limit=last - after)
        }
        produced = reads.turn_memories(deps.db, org_id, session_id, first, last)
        items = [self._turn(who, t, states.get(t.turn_index), produced) for t in turns]
        head = fmt(
            '<p class="meta">{} turns · status {} · pointer {} · {} done, {} pending, {} failed'
            " · {}</p>",
            session.turn_count,
            session.status,
            progress.pointer,
            progress.done,
            progress.pending,
            progress.failed,
            link(url("/console/conversations", who.params()), "all conversations"),
        )
        paging = []
        if after > 0:
            back = max(after - PAGE_SIZE, 0)
            paging.append(link(url(req.path, who.params(after=back or None)), "← Previous turns"))
        if last < session.turn_count:
            paging.append(link(url(req.path, who.params(after=last)), "Next turns →"))
        nav = fmt('<p class="paging">{}</p>', join(paging, " · ")) if paging else Markup("")
        body = head + (Markup("".join(items)) if items else esc("No turns yet.")) + nav
        return f"Conversation {session.external_id}", body

    def _turn(
        self, who: Viewer, turn: Any, recorded: RecordedTurn | None, produced: dict[int, list[Any]]
    ) -> Markup:
        state = recorded.state if recorded is not None else "pending"
        if recorded is not None and recorded.reason:
            state_note = fmt(' <span class="meta">({})</span>', recorded.reason)
        else:
            state_note = Markup("")
        lines = [
            fmt(
                '<div class="message"><span class="role">{}</span><pre>{}</pre></div>',
                m.get("role", "?") if isinstance(m, dict) else "?",
                _text(m.get("content")) if isinstance(m, dict) else _text(m),
            )
            for m in turn.messages
        ]
        completion = turn.completion if isinstance(turn.completion, dict) else {}
        lines.append(
            fmt(
                '<div class="message completion"><span class="role">{}</span><pre>{}</pre></div>',
                completion.get("role", "assistant"),
                _text(completion.get("content", "")),
            )
        )
        memories = produced.get(turn.turn_index, [])
        made = Markup("")
        if memories:
            made = fmt(
                '<ul class="produced">{}</ul>',
                Markup(
                    "".join(
                        fmt(
                            '<li><span class="kind">{}</span> {}{}</li>',
                            m.kind,
                            m.content,
                            esc(" (superseded since then)") if m.superseded_by else "",
                        )
                        for m in memories
                    )
                ),
            )
        return fmt(
            '<section class="turn" id="turn-{}"><h2>Turn {} <span class="state state-{}">{}'
            '</span>{}</h2>{}<p class="meta">{} prompt + {} completion tokens · {} ms</p>{}{}'
            "</section>",
            turn.turn_index,
            turn.turn_index,
            state,
            state.replace("_", " "),
            state_note,
            Markup("".join(lines)),
            turn.prompt_tokens,
            turn.completion_tokens,
            turn.latency_ms,
            _cost(recorded.usage if recorded is not None else None),
            made,
        )


def _cost(usage: TurnUsage | None) -> Markup:
    """What extracting the turn cost, once known (the usage ledger)."""
    if usage is None:
        return Markup("")
    return fmt(
        '<p class="meta cost">extraction: {} LLM call{} · {} input + {} output tokens'
        " · {} embedding tokens · ${}</p>",
        usage.llm_calls,
        "" if usage.llm_calls == 1 else "s",
        usage.input_tokens,
        usage.output_tokens,
        usage.embedding_tokens,
        f"{usage.cost:.6f}",
    )
