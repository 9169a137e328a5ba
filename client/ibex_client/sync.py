"""``IbexClient``: the sessions, memories, search and context API for applications (sync).

Every call is safe to repeat, so every call is retried on 408, 429, 5xx, 409
``IDEMPOTENCY_IN_PROGRESS``, timeouts and connection errors, honouring ``Retry-After``, up to
the :class:`~ibex_client._base.RetryPolicy`'s attempts; other errors are raised at
once as typed :mod:`~ibex_client.errors`. Thread-safe (one pooled ``httpx.Client``).

This file and :mod:`~ibex_client.aio` mirror each other on purpose, as httpx's
``Client`` and ``AsyncClient`` do: every request and every reading of an answer is built once
in :mod:`~ibex_client._calls` and every retry decision in
:mod:`~ibex_client._base`, so each method here is one line. What repeats between the
two files is the public signatures and ``_run``'s loop, which differ only by ``async``/``await``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import httpx

from ibex_client import _calls
from ibex_client._base import (
    Call,
    ClientCore,
    Retry,
    RetryPolicy,
    extraction_settled,
    extraction_timeout,
    only_session,
)
from ibex_client._calls import Id
from ibex_client.types import (
    Agent,
    Context,
    ForgottenUser,
    Memory,
    MemorySource,
    Page,
    RecordedTurn,
    SearchHit,
    Session,
    Turn,
    TurnsAppended,
)

T = TypeVar("T")


class IbexClient:
    """A client of one IBEX service for one token.

    ``org_id`` is sent as ``X-IBEX-Org-ID`` (needed with a service token). ``transport=``
    swaps the network for another httpx transport (``httpx.MockTransport`` in tests);
    ``client=`` uses an ``httpx.Client`` of the caller's, which this client then does not
    close. ``sleep`` is how the client waits between attempts.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        org_id: Id | None = None,
        timeout: float = 10.0,
        retry: RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
        client: httpx.Client | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if client is not None and transport is not None:
            raise ValueError("give transport= or client=, not both")
        self._base = ClientCore(base_url, token, org_id, retry or RetryPolicy())
        self._owns_http = client is None
        self._http = client or httpx.Client(
            timeout=httpx.Timeout(timeout), transport=transport, follow_redirects=False
        )
        self._sleep = sleep

    def __repr__(self) -> str:
        return f"IbexClient({self._base.base_url!r})"

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> IbexClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- sessions ----------------------------------------------------------------------------

    def create_session(
        self,
        agent: str | None = None,
        *,
        agent_id: Id | None = None,
        external_id: str | None = None,
        model: str | None = None,
        provider: str | None = None,
        create_agent: bool = False,
        user: str | None = None,
        user_id: Id | None = None,
    ) -> Session:
        """Start a session of ``agent`` (the slug of one of the org's agents; one it does not
        have raises :class:`~ibex_client.errors.NotFoundError` ``UNKNOWN_AGENT``, unless
        ``create_agent``, which creates it) or ``agent_id``; the same ``external_id`` again
        returns the existing session. Without an external id every call opens a new session,
        so the call is retried only when it could not connect. ``user`` (the application's
        key for the person, created when missing) or ``user_id`` is whose conversation it is,
        set once (another one later raises :class:`~ibex_client.errors.UserConflictError`)."""
        who = _calls.Who(user=user, user_id=user_id)
        return self._run(
            _calls.create_session(agent, agent_id, external_id, model, provider, create_agent, who)
        )

    def append_turns(self, session_id: Id, turns: Sequence[Turn]) -> TurnsAppended:
        """Append turns in order; turns already stored with the same content are no-ops
        (``turns_added`` counts the others). Raises
        :class:`~ibex_client.errors.TurnConflictError` or
        :class:`~ibex_client.errors.TurnGapError`."""
        return self._run(_calls.append_turns(session_id, turns))

    def complete_session(
        self, session_id: Id, *, wait: bool = False, timeout: float = 60.0
    ) -> Session:
        """Mark the session completed: its turns will be extracted. With ``wait``, return
        once they are (:meth:`wait_for_extraction`, up to ``timeout`` seconds)."""
        session = self._run(_calls.change_status(session_id, "complete"))
        if wait and not extraction_settled(session):
            return self.wait_for_extraction(session_id, timeout=timeout)
        return session

    def wait_for_extraction(
        self, session_id: Id, *, timeout: float = 60.0, interval: float = 0.5
    ) -> Session:
        """Poll the session every ``interval`` seconds until no turn of it is pending
        extraction (``progress.pending == 0``: its memories are written; a turn that failed
        extraction is not waited for, ``progress.failed`` counts it) and return it; after
        ``timeout`` seconds raise :class:`~ibex_client.errors.ExtractionTimeoutError`, which
        says why (an active session is extracted only once completed)."""
        deadline = time.monotonic() + timeout
        while True:
            session = self.get_session(session_id)
            if extraction_settled(session) and session.status != "active":
                return session
            if time.monotonic() >= deadline:
                raise extraction_timeout(session, timeout)
            self._sleep(min(interval, max(deadline - time.monotonic(), 0.0)))

    def find_session(
        self, agent: str | Id, external_id: str, *, user_id: Id | None = None
    ) -> Session | None:
        """The session of ``agent`` (slug or id) with ``external_id`` (the id a chat app sends
        as ``X-IBEX-Session-ID``), or None. An external id names one session per user: when
        several people have one, ``user_id`` says whose (else ``ValueError``)."""
        agent_id = (self.get_agent(agent)).id
        found = [
            s
            for s in self.iter_sessions(agent_id=agent_id, external_id=external_id)
            if user_id is None or str(s.user_id) == str(user_id)
        ]
        return only_session(found, str(agent), external_id)

    def abandon_session(self, session_id: Id) -> Session:
        """Mark the session abandoned: it will never be extracted."""
        return self._run(_calls.change_status(session_id, "abandon"))

    def get_session(self, session_id: Id) -> Session:
        return self._run(_calls.get_session(session_id))

    def list_sessions(
        self,
        *,
        agent_id: Id | None = None,
        external_id: str | None = None,
        status: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page[Session]:
        return self._run(_calls.list_sessions(agent_id, external_id, status, limit, cursor))

    def list_turns(
        self, session_id: Id, *, limit: int | None = None, cursor: str | None = None
    ) -> Page[RecordedTurn]:
        """The session's turns in order, each as recorded with its extraction state and
        usage (``GET /v1/sessions/{id}/turns``): one page."""
        return self._run(_calls.list_turns(session_id, limit, cursor))

    def iter_sessions(
        self,
        *,
        agent_id: Id | None = None,
        external_id: str | None = None,
        status: str | None = None,
        page_size: int | None = None,
    ) -> Iterator[Session]:
        """Every matching session, fetching page after page as the iteration goes."""
        cursor: str | None = None
        while True:
            page = self.list_sessions(
                agent_id=agent_id,
                external_id=external_id,
                status=status,
                limit=page_size,
                cursor=cursor,
            )
            yield from page.items
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def delete_session(self, session_id: Id) -> bool:
        """Soft-delete the session and every memory extracted from it. False when there was
        no such session (including when an earlier attempt of this call deleted it)."""
        return self._run(_calls.delete_session(session_id))

    # -- memories ----------------------------------------------------------------------------

    def create_memory(
        self,
        agent_id: Id,
        content: str,
        *,
        kind: str = "fact",
        source: MemorySource | None = None,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        supersedes: Sequence[Id] | None = None,
        user: str | None = None,
        user_id: Id | None = None,
    ) -> Memory:
        """Store a memory under ``idempotency_key`` (a fresh one per call when not given; the
        same on every retry of the call). Content the agent already has (or near-identical
        content) raises :class:`~ibex_client.errors.DuplicateContentError` with
        ``existing_id``. ``supersedes``: current memories of the same agent (and user) this
        one replaces; they are marked superseded in the same transaction, never deleted.
        ``user`` or ``user_id``: whose memory it is (none: agent-wide)."""
        who = _calls.Who(user=user, user_id=user_id)
        return self._run(
            _calls.create_memory(
                agent_id, content, kind, source, metadata, idempotency_key, supersedes, who
            )
        )

    def get_memory(
        self,
        memory_id: Id,
        *,
        user: str | None = None,
        user_id: Id | None = None,
        include_shared: bool | None = None,
        all_users: bool | None = None,
    ) -> Memory:
        """The memory, if it is the user's or agent-wide (without a user: agent-wide only);
        another person's memory raises :class:`~ibex_client.errors.NotFoundError`."""
        who = _calls.Who(user, user_id, include_shared, all_users)
        return self._run(_calls.get_memory(memory_id, who))

    def list_memories(
        self,
        *,
        agent_id: Id | None = None,
        session_id: Id | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        include_superseded: bool = False,
        user: str | None = None,
        user_id: Id | None = None,
        include_shared: bool | None = None,
        all_users: bool | None = None,
    ) -> Page[Memory]:
        """One page, newest first: current memories (and superseded ones too when
        ``include_superseded``) of the user and the agent-wide ones (``include_shared=False``:
        the user's only); without a user the agent-wide ones; ``all_users=True`` (scope
        memory:admin) everyone's."""
        who = _calls.Who(user, user_id, include_shared, all_users)
        return self._run(
            _calls.list_memories(agent_id, session_id, limit, cursor, include_superseded, who)
        )

    def iter_memories(
        self,
        *,
        agent_id: Id | None = None,
        session_id: Id | None = None,
        page_size: int | None = None,
        include_superseded: bool = False,
        user: str | None = None,
        user_id: Id | None = None,
        include_shared: bool | None = None,
        all_users: bool | None = None,
    ) -> Iterator[Memory]:
        """Every matching memory, newest first, fetching page after page as needed."""
        cursor: str | None = None
        while True:
            page = self.list_memories(
                agent_id=agent_id,
                session_id=session_id,
                limit=page_size,
                cursor=cursor,
                include_superseded=include_superseded,
                user=user,
                user_id=user_id,
                include_shared=include_shared,
                all_users=all_users,
            )
            yield from page.items
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def history(
        self,
        memory_id: Id,
        *,
        user: str | None = None,
        user_id: Id | None = None,
        include_shared: bool | None = None,
        all_users: bool | None = None,
    ) -> tuple[Memory, ...]:
        """The supersession chain the memory belongs to, oldest first (superseded memories
        with their ``superseded_by``, the current one last); the user fields as for
        :meth:`get_memory` (another person's memory raises
        :class:`~ibex_client.errors.NotFoundError`)."""
        who = _calls.Who(user, user_id, include_shared, all_users)
        return self._run(_calls.memory_history(memory_id, who))

    def delete_memory(self, memory_id: Id, *, user: str | None = None) -> bool:
        """Soft-delete a memory. False when there was no such memory (including when an
        earlier attempt of this call deleted it). A token deletes only what it can read: a
        person's memory needs their ``user``, a token bound to them, or the ``memory:admin``
        scope; another person's memory is False, as an unknown one."""
        return self._run(_calls.delete_memory(memory_id, _calls.Who(user)))

    # -- read path ---------------------------------------------------------------------------

    def search(
        self,
        query: str,
        *,
        agent_id: Id | None = None,
        session_id: Id | None = None,
        kinds: Sequence[str] | None = None,
        limit: int | None = None,
        include_superseded: bool = False,
        agent: str | None = None,
        user: str | None = None,
        user_id: Id | None = None,
        include_shared: bool | None = None,
        all_users: bool | None = None,
        min_score: float | None = None,
    ) -> tuple[SearchHit, ...]:
        """The agent's memories that match ``query``, best first: the user's and the
        agent-wide ones (without a user: agent-wide only). The agent is ``agent`` (a slug) or
        ``agent_id``, exactly one; one the org does not have raises
        :class:`~ibex_client.errors.NotFoundError` (``UNKNOWN_AGENT``). ``min_score`` (0-1)
        keeps only the hits that score at least that: higher trades recall for precision
        (the scope's nearest memories by meaning are hits too, and score low when they share
        no word with the query)."""
        who = _calls.Who(user, user_id, include_shared, all_users)
        return self._run(
            _calls.search(
                query,
                agent_id,
                session_id,
                kinds,
                limit,
                include_superseded,
                agent,
                who,
                min_score,
            )
        )

    def context(
        self,
        agent_id: Id | None = None,
        *,
        agent: str | None = None,
        query: str | None = None,
        messages: Sequence[Mapping[str, Any]] | None = None,
        session_id: Id | None = None,
        kinds: Sequence[str] | None = None,
        max_tokens: int | None = None,
        include_superseded: bool = False,
        user: str | None = None,
        user_id: Id | None = None,
        include_shared: bool | None = None,
        all_users: bool | None = None,
    ) -> Context:
        """The best memories for ``query`` (or the conversation's last ``messages``) packed
        into ``max_tokens``, as a block for a system prompt: the user's memories and the
        agent-wide ones (without a user: agent-wide only). The agent is ``agent`` (a slug)
        or ``agent_id``, exactly one, as for :meth:`search`."""
        who = _calls.Who(user, user_id, include_shared, all_users)
        return self._run(
            _calls.context(
                agent_id,
                query,
                messages,
                session_id,
                kinds,
                max_tokens,
                include_superseded,
                agent,
                who,
            )
        )

    # -- users -------------------------------------------------------------------------------

    def get_agent(self, agent: str | Id) -> Agent:
        """The org's agent by slug or id (its id is what the memory calls take); one the org
        does not have raises :class:`~ibex_client.errors.NotFoundError` (``UNKNOWN_AGENT``)."""
        return self._run(_calls.get_agent(agent))

    def forget_user(self, user: str | Id) -> ForgottenUser | None:
        """Forget a user (by the application's key or id; scope users:delete): the user, their
        sessions and memories are deleted at once, their tokens revoked. None when there was
        no such user (including when an earlier attempt of this call forgot them)."""
        return self._run(_calls.forget_user(user))

    # -- plumbing ----------------------------------------------------------------------------

    def send(self, call: Call[T]) -> T:
        """Send a prepared call (:mod:`ibex_client.wire`) as every method sends its own: this
        client's headers, retry policy and typed errors; returns what ``call.parse`` makes
        of a 2xx answer."""
        return self._run(call)

    def _run(self, call: Call[T]) -> T:
        request = self._base.request(self._http, call)
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._http.send(request)
            except httpx.TransportError as exc:
                outcome: T | Retry = self._base.failed(call, exc, attempt)
            else:
                outcome = self._base.decide(call, response, attempt)
            if not isinstance(outcome, Retry):
                return outcome
            self._sleep(outcome.delay)
