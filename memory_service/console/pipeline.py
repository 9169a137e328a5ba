"""Pipeline (operators only: a service token, or an org token with ``memory:admin`` for its
own org): queue depths, the lag of the oldest pending turn, throughput over the last minutes,
dead letters with their reason, replay and discard, and the tokens, listed and revoked.

Replay is :meth:`extraction.deadletters.DeadLetterStore.replay`, the code of ``ibex dlq
replay``: one transaction claims the mirror row and reopens the turn, a Lua script moves the
message back under a new Redis id, so two operators pressing the button at once replay it
once. Discard deletes the letter from Redis and marks the mirror row purged, as ``ibex dlq
purge`` does for one letter."""

from __future__ import annotations

import uuid
from typing import Any

import falcon
import redis

from extraction.deadletters import DeadLetter
from extraction.status import collect, throughput
from memory_service.console.base import Action, Page
from memory_service.console.markup import Markup, esc, fmt, hidden, link, table, url
from memory_service.console.paging import keyed_page, next_link
from memory_service.console.people import when
from memory_service.console.session import Refused, Viewer
from schema.messages import WORKER_QUEUES

THROUGHPUT_MINUTES = 15


def need_operator(who: Viewer) -> None:
    if not who.operator:
        raise Refused(403, "Not allowed", "the pipeline is for a service or admin token")


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _button(who: Viewer, action: str, label: str, name: str, value: str) -> Markup:
    return fmt(
        '<form method="post" action="{}" class="inline">{}{}<button type="submit">{}</button>'
        "</form>",
        url(action, who.params()),
        hidden("csrf", who.csrf),
        hidden(name, value),
        label,
    )


def visible(who: Viewer, letter: DeadLetter) -> bool:
    """A service token sees every letter; an org admin its own org's."""
    return who.principal.is_service or letter.org_id == str(who.org_id)


class PipelinePage(Page):
    def get(self, req: falcon.Request, who: Viewer, **_: Any) -> tuple[str, Markup]:
        need_operator(who)
        deps = self.deps
        own = None if who.principal.is_service else who.org_id
        notes: list[str] = []
        counts = deps.queue_counts
        try:
            status = collect(deps.db, counts, queues=list(WORKER_QUEUES))
        except redis.RedisError:
            notes.append("Redis did not answer: queue depths unknown")
            status = collect(deps.db, None, queues=list(WORKER_QUEUES))
        orgs = [o for o in status.orgs if own is None or o.org_id == str(own)]
        backlog = table(
            ["org", "pending", "in flight", "waiting", "failed", "done", "oldest pending"],
            [
                [
                    o.org,
                    o.turns_pending,
                    o.turns_in_flight,
                    o.turns_waiting,
                    o.turns_failed,
                    o.turns_done,
                    _age(o.oldest_pending_age_seconds),
                ]
                for o in orgs
            ],
            empty="No org yet.",
        )
        queues = table(
            ["queue", "ready", "delayed", "dead (Redis)", "dead (mirror)"],
            [
                [
                    name,
                    q.get("ready", "?"),
                    q.get("delayed", "?"),
                    q.get("dead_redis", "?"),
                    q.get("dead_mirror", 0),
                ]
                for name, q in status.queues.items()
            ],
            empty="No queue.",
        )
        per_minute = throughput(deps.db, THROUGHPUT_MINUTES, str(own) if own else None)
        rate = table(
            ["minutes ago", *[str(i) for i in range(THROUGHPUT_MINUTES)]],
            [["turns done", *per_minute]],
            empty="",
        )
        try:
            every = [x for x in deps.dead_letters().list() if visible(who, x)]
        except redis.RedisError:
            notes.append("Redis did not answer: dead letters unknown")
            every = []
        letters, more_letters = keyed_page(
            every, lambda x: (x.failed_at, x.ref), req.get_param("letters")
        )
        dead = table(
            ["id", "queue", "actor", "slot", "failed", "tries", "reason", ""],
            [
                [
                    letter.ref,
                    letter.queue,
                    letter.actor or "?",
                    letter.slot,
                    when(letter.failed_at),
                    letter.attempts,
                    f"MALFORMED: {letter.malformed}"
                    if letter.malformed
                    else f"{letter.exception_type or '?'}: {letter.exception_message or ''}",
                    (
                        Markup("")
                        if letter.malformed
                        else _button(who, "/console/pipeline/replay", "Replay", "ref", letter.ref)
                    )
                    + _button(who, "/console/pipeline/discard", "Discard", "ref", letter.ref),
                ]
                for letter in letters
            ],
            empty="No dead letters.",
        )
        tokens, more_tokens = keyed_page(
            [t for t in deps.tokens.list() if own is None or t.org_id == own],
            lambda t: (t.created_at, str(t.id)),
            req.get_param("tokens"),
        )
        token_rows = table(
            ["prefix", "name", "owner", "scopes", "created", "last used", "state", ""],
            [
                [
                    t.prefix + "…",
                    t.name or "",
                    "service"
                    if t.org_id is None
                    else (f"user {t.user_id}" if t.user_id else "org"),
                    " ".join(t.scopes),
                    when(t.created_at),
                    when(t.last_used_at),
                    "revoked" if t.revoked_at else "live",
                    Markup("")
                    if t.revoked_at
                    else _button(who, "/console/pipeline/revoke", "Revoke", "token_id", str(t.id)),
                ]
                for t in tokens
            ],
            empty="No tokens.",
        )
        body = (
            Markup("".join(fmt('<p class="note">{}</p>', n) for n in notes))
            + fmt("<h2>Backlog</h2>")
            + backlog
            + fmt("<h2>Queues</h2>")
            + queues
            + fmt("<h2>Throughput</h2>")
            + rate
            + fmt("<h2>Dead letters</h2>")
            + fmt('<p class="meta">{} open</p>', len(every))
            + dead
            + self._next(req, who, "letters", more_letters)
            + fmt("<h2>Tokens</h2>")
            + token_rows
            + self._next(req, who, "tokens", more_tokens)
        )
        return "Pipeline", body

    def _next(self, req: falcon.Request, who: Viewer, name: str, cursor: str | None) -> Markup:
        if cursor is None:
            return Markup("")
        return next_link(url(req.path, who.params(**{name: cursor})), f"More {name} →")


def _back(who: Viewer, text: str) -> tuple[str, Markup]:
    return "Pipeline", fmt(
        "<p>{}</p><p>{}</p>", text, link(url("/console/pipeline", who.params()), "Back")
    )


def _open_letter(deps: Any, who: Viewer, form: dict[str, str]) -> tuple[Any, str, Any]:
    """The dead-letter store, the form's ``ref`` and its open letter when this operator may
    see it (None otherwise: another org's letter is answered as a missing one)."""
    need_operator(who)
    ref = form.get("ref", "")
    store = deps.dead_letters()
    letter = store.get(ref) if ref else None
    if letter is not None and not visible(who, letter):
        letter = None
    return store, ref, letter


class ReplayAction(Action):
    def post(
        self, req: falcon.Request, who: Viewer, form: dict[str, str], **_: Any
    ) -> str | tuple[str, Markup]:
        store, ref, letter = _open_letter(self.deps, who, form)
        if letter is None:
            # Already replayed, discarded, or never there: nothing is sent.
            return _back(who, f"No open dead letter {ref}: nothing replayed.")
        report = store.replay([letter.ref])
        return _back(who, report.summary())


class DiscardAction(Action):
    def post(
        self, req: falcon.Request, who: Viewer, form: dict[str, str], **_: Any
    ) -> str | tuple[str, Markup]:
        store, ref, letter = _open_letter(self.deps, who, form)
        if letter is None or not store.discard(letter.ref):
            return _back(who, f"No open dead letter {ref}: nothing discarded.")
        return _back(who, f"Discarded dead letter {letter.ref}.")


class RevokeAction(Action):
    def post(
        self, req: falcon.Request, who: Viewer, form: dict[str, str], **_: Any
    ) -> str | tuple[str, Markup]:
        need_operator(who)
        try:
            token_id = uuid.UUID(form.get("token_id", ""))
        except ValueError:
            raise Refused(400, "Bad request", "token_id: not a token id") from None
        own = None if who.principal.is_service else who.org_id
        known = {t.id: t for t in self.deps.tokens.list()}
        token = known.get(token_id)
        if token is None or (own is not None and token.org_id != own):
            return _back(who, "No such token.")
        self.deps.tokens.revoke(token_id)
        return _back(who, esc(f"Revoked token {token.prefix}…"))
