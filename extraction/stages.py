"""The pipeline's four stages as plain functions.

Each stage does its work in Postgres transactions and *returns* the follow-up messages as data
(:class:`Send`); the caller sends them only after the stage returned, i.e. after every
transaction that recorded the stage has committed. The Dramatiq actors (``actors/``) are thin
shells around these functions, and ``ibex extract`` runs the same functions inline.

Every stage is safe to run any number of times, in any order, concurrently: what it does is
decided by the per-turn state (:mod:`extraction.turns`), never by the message or the broker.

An LLM answer is never thrown away because the database is briefly unavailable: the stage
persists it with bounded retries (each on a fresh connection), and when the outage outlasts
them it keeps the answer in the process (:class:`~extraction.caches.AnswerCache`) and records,
on its :class:`Delivery`, the claim it could not release; the message's own retry then takes
that claim over at once and persists the kept answer without calling the LLM.

``deps.fault`` is a test seam: it is called with the name of each crash point just after the
step it names (``after_llm_call``, ``after_persist``, ``after_post``, ``after_record_slot``,
``after_mark_done``, ``after_advance``), so a test can kill a stage exactly there.

Facts that change: the claim's transaction also reads the scope's current memories most
related to the turn; the prompt lists them under local refs (``m1``...), and the refs an
answer says a memory ``replaces`` are resolved to memory ids *before* the result is persisted
(unknown refs are dropped and counted), so every retry, redelivery or replay writes the same
``supersedes``. Before calling the LLM, the stage looks for a result persisted for the same
input (:func:`extraction.prompt.input_hash`) in the same scope, and reuses it: no LLM call.

Over 400 lines but one idea: the four stages side by side, since each is written against what
the next one may assume (the persisted result, the slot identity, the pointer rule).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from core.config import Settings
from core.errors import (
    ConfigError,
    DatabaseUnavailableError,
    EmbeddingsUnavailable,
    InvalidMessageError,
    LLMUnavailableError,
    MemoryRejectedError,
    MemoryUnavailableError,
    PermanentError,
    RowNotFoundError,
    TurnBusyError,
)
from embeddings import Embedder, embed_counted
from extraction.keys import idempotency_key
from extraction.metrics import PipelineMetrics
from extraction.prompt import RelatedMemory, input_hash
from extraction.result import ExtractedMemory, ExtractionResult
from extraction.scan_queries import ScanQueries
from extraction.turns import TurnStore
from extraction.values import (
    AlreadyDone,
    Busy,
    Candidate,
    Claimed,
    GaveUp,
    LlmAnswer,
    OverBudget,
    Persisted,
    PersistedResult,
    TurnRef,
)
from schema.messages import ActorName
from sessions.store import SessionStore
from sessions.turns import TurnRecord

log = logging.getLogger(__name__)


class ExtractionAbandonedError(PermanentError):
    """A turn used up its extraction attempts (counted by us, so a worker killed mid-call
    counts too); it dead-letters with the last error until an operator replays it."""


class ProviderLike(Protocol):
    name: str
    model: str

    def extract(
        self, turn: TurnRecord, context: Sequence[TurnRecord], related: Sequence[RelatedMemory] = ()
    ) -> ExtractionResult: ...


class WriteResultLike(Protocol):
    @property
    def status(self) -> int: ...
    @property
    def memory_id(self) -> uuid.UUID | None: ...
    @property
    def code(self) -> str | None: ...
    @property
    def replayed(self) -> bool: ...


class MemoryWriter(Protocol):
    def create_memory(
        self, org_id: uuid.UUID | str, body: Mapping[str, Any], idempotency_key: str
    ) -> WriteResultLike: ...


@dataclass(frozen=True)
class Send:
    """A message to send once the stage that produced it has returned."""

    actor_name: str
    kwargs: dict[str, Any]

    def __str__(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.kwargs.items())
        return f"{self.actor_name}({args})"


#: How long ``extract_turn`` keeps trying to persist an LLM answer it holds while the database
#: is unavailable (a restart takes seconds; never past the turn's claim), and its first and
#: longest pause between tries.
PERSIST_RETRY_SECONDS = 15.0
PERSIST_BACKOFF_SECONDS = (0.1, 2.0)


@dataclass
class Delivery:
    """One delivery of a message, as its runner knows it. ``abandoned_claim`` is the LLM claim
    an attempt of this message left without releasing it (the database was unavailable): the
    runner carries it into the message's retry, which may then take that claim over at once.
    A redelivery of a stalled attempt does not carry it, so it waits for the claim."""

    message_id: str | None = None
    abandoned_claim: uuid.UUID | None = None


@dataclass
class StageDeps:
    """What the stages need; built once per process (worker middleware, CLI, tests)."""

    store: SessionStore
    settings: Settings
    provider: ProviderLike | None = None
    memory: MemoryWriter | None = None
    fault: Callable[[str], None] | None = None
    metrics: PipelineMetrics = field(default_factory=PipelineMetrics)
    #: Embeds a turn's memories (one request per turn) before the result is persisted;
    #: None: results are persisted without vectors.
    embedder: Embedder | None = None
    persist_retry_seconds: float = PERSIST_RETRY_SECONDS
    turns: TurnStore = field(init=False)
    scan_queries: ScanQueries = field(init=False)

    def __post_init__(self) -> None:
        self.turns = TurnStore(self.store.db)
        self.scan_queries = ScanQueries(self.store.db)

    @property
    def max_attempts(self) -> int:
        """LLM attempts per turn before it dead-letters: as many as Dramatiq deliveries."""
        return self.settings.max_retries + 1

    def crash_point(self, name: str) -> None:
        if self.fault is not None:
            self.fault(name)

    def need_provider(self) -> ProviderLike:
        if self.provider is None:
            raise ConfigError("no LLM provider configured", variable="LLM_PROVIDER")
        return self.provider

    def need_memory(self) -> MemoryWriter:
        if self.memory is None:
            raise ConfigError(
                "MEMORY_SERVICE_TOKEN is not set: cannot write memories",
                variable="MEMORY_SERVICE_TOKEN",
            )
        return self.memory


# -- scan_sessions ---------------------------------------------------------------------------


@dataclass
class ScanReport:
    sessions: int = 0
    sent: list[Send] = field(default_factory=list)

    @property
    def turns(self) -> int:
        return len(self.sent)


def scan(deps: StageDeps, *, session_id: uuid.UUID | str | None = None) -> ScanReport:
    """Find completed sessions with unextracted turns, record those turns, and lease the ones
    not done, not failed and not in flight: one ``extract_turn`` each. At most
    ``SCAN_MAX_TURNS_PER_AGENT`` per agent, so one tenant's backlog cannot starve the rest.
    While the leases are live a second scan sends nothing."""
    settings = deps.settings
    report = ScanReport()
    budget: dict[uuid.UUID, int] = defaultdict(lambda: settings.scan_max_turns_per_agent)
    for chunk in _lease_chunks(_candidate_batches(deps, session_id)):
        report.sessions += len(chunk)
        agent_of = {c.session_id: c.agent_id for c in chunk}
        live = {c.agent_id: budget[c.agent_id] for c in chunk if budget[c.agent_id] > 0}
        if not live:
            continue
        leased = deps.scan_queries.lease_turns(chunk, live, settings.extraction_lease_seconds)
        for ref in leased:
            budget[agent_of[ref.session_id]] -= 1
        report.sent.extend(Send(ActorName.EXTRACT, ref.as_message()) for ref in leased)
    log.info("scan: %d sessions, %d turns sent", report.sessions, report.turns)
    return report


#: Candidate sessions recorded and leased together: one transaction, one statement per org.
#: Candidate pages (``SCAN_BATCH_SIZE``) are gathered up to this many sessions first, so a batch
#: spread over many orgs does not cost one statement per org per page.
LEASE_CHUNK_SESSIONS = 5000


def _lease_chunks(batches: Iterator[list[Candidate]]) -> Iterator[list[Candidate]]:
    chunk: list[Candidate] = []
    for batch in batches:
        chunk.extend(batch)
        if len(chunk) >= LEASE_CHUNK_SESSIONS:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _candidate_batches(
    deps: StageDeps, session_id: uuid.UUID | str | None
) -> Iterator[list[Candidate]]:
    if session_id is not None:
        found = deps.scan_queries.find_candidate(session_id)
        yield [found] if found else []
        return
    after: tuple[uuid.UUID, uuid.UUID] | None = None
    while True:
        batch = deps.scan_queries.candidates(deps.settings.scan_batch_size, after)
        if not batch:
            return
        yield batch
        if len(batch) < deps.settings.scan_batch_size:
            return
        after = (batch[-1].agent_id, batch[-1].session_id)


# -- extract_turn ----------------------------------------------------------------------------


def _fan_out(ref: TurnRef, persisted: Persisted) -> list[Send]:
    """One write_memory per slot not yet written, or advance_pointer when none is left."""
    count = len(persisted.result.memories)
    missing = [o for o in range(count) if o not in persisted.written]
    if not missing:
        return [Send(ActorName.POINTER, ref.as_message())]
    return [Send(ActorName.WRITE, {**ref.as_message(), "ordinal": o}) for o in missing]


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def extract_turn(
    deps: StageDeps,
    org_id: uuid.UUID | str,
    session_id: uuid.UUID | str,
    turn_index: int,
    *,
    delivery: Delivery | None = None,
) -> list[Send]:
    """Extract one turn: reuse the stored result if there is one, else call the LLM once under
    a claim (or use the answer this process kept from an earlier attempt), persist the
    validated result (first wins), then fan out to the slots."""
    ref = TurnRef.of(org_id, session_id, turn_index)
    settings = deps.settings
    kept = deps.turns.answers.get(ref)
    claim_ends = time.monotonic() + settings.extraction_claim_seconds  # or later, never sooner
    begun = deps.turns.begin_extract(
        ref,
        claim_seconds=settings.extraction_claim_seconds,
        lease_seconds=settings.extraction_lease_seconds,
        max_attempts=deps.max_attempts,
        context_turns=settings.extraction_context_turns,
        takeover=delivery.abandoned_claim if delivery is not None else None,
        call_llm=kept is None,
        related=settings.extraction_related_memories if kept is None else 0,
    )
    if isinstance(begun, AlreadyDone | Persisted):
        deps.turns.answers.discard(ref)
        return _fan_out(ref, begun) if isinstance(begun, Persisted) else []
    if isinstance(begun, Busy):
        raise TurnBusyError(
            f"turn {ref.turn_index} of {ref.session_id} is being extracted by another delivery",
            retry_after=begun.retry_after,
        )
    if isinstance(begun, OverBudget):
        # No LLM call, no attempt counted, no retry consumed: the message ends here and the
        # scan sends the turn again when its short lease ends (or at once once the budget is
        # raised), so the turn waits in the database, never in the queue.
        deps.metrics.budget_wait(str(ref.org_id))
        log.info("turn %s waits: its org's token budget is spent", ref)
        return []
    if isinstance(begun, GaveUp):
        raise ExtractionAbandonedError(
            f"turn {ref.turn_index} of {ref.session_id}: gave up after {begun.attempts}"
            f" extraction attempts; last error: {begun.last_error or 'none recorded'}"
        )
    assert isinstance(begun, Claimed)
    if delivery is not None:
        delivery.abandoned_claim = None  # taken over, or a claim of our own from here on
    answer = kept if kept is not None else _call_llm(deps, ref, begun, delivery)
    deps.crash_point("after_llm_call")
    answer = _embedded(deps, ref, answer)
    stored = _persist(deps, ref, begun.token, answer, delivery, claim_ends)
    deps.crash_point("after_persist")
    return _fan_out(ref, stored)


def _call_llm(
    deps: StageDeps, ref: TurnRef, begun: Claimed, delivery: Delivery | None
) -> LlmAnswer:
    try:
        provider = deps.need_provider()
        turns = begun.turns  # read in the claim's transaction
        if not turns or turns[-1].turn_index != ref.turn_index:
            raise RowNotFoundError(f"turn {ref.turn_index} of {ref.session_id} not found")
        name, model = getattr(provider, "name", ""), getattr(provider, "model", "")
        digest = input_hash(
            (ref.org_id, begun.agent_id, begun.user_id), name, model, turns[-1], turns[:-1]
        )
        found = deps.turns.find_result(ref, digest)
        if found is not None:
            # A repeated input: the result persisted for it is this turn's too, no LLM call.
            stored, stored_provider, stored_model = found
            deps.metrics.repeated_turn()
            log.info("turn %s: input seen before, its persisted result is reused", ref)
            return LlmAnswer(stored, stored_provider, stored_model, 0, 0, digest, reused=True)
        refs = {f"m{i + 1}": memory for i, memory in enumerate(begun.related)}
        related = [RelatedMemory(r, content, kind) for r, (_, content, kind) in refs.items()]
        started = time.monotonic()
        try:
            result = provider.extract(turns[-1], turns[:-1], related)
        except Exception:
            deps.metrics.llm_call(name, ok=False)
            raise
        latency_ms = round((time.monotonic() - started) * 1000)
        deps.metrics.llm_call(
            result.provider or name,
            ok=True,
            prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
        )
        return LlmAnswer(
            _validated(_resolve_refs(deps, result, {r: m[0] for r, m in refs.items()})),
            provider=result.provider or getattr(provider, "name", None),
            model=result.model or getattr(provider, "model", None),
            prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
            input_hash=digest,
            latency_ms=latency_ms,
        )
    except Exception as exc:
        # Best effort: a failed call releases its claim so the retry need not wait for it.
        try:
            deps.turns.release_claim(ref, begun.token, _describe(exc))
        except Exception:
            log.warning("could not release the claim on %s", ref, exc_info=True)
            if delivery is not None:
                delivery.abandoned_claim = begun.token
        raise


#: Significant digits kept of each vector component (a float32's): the persisted result and
#: the POST bodies stay compact, and the vector is the same on every read.
VECTOR_DIGITS = 7
#: One component's format, repeated: a vector is rounded by one formatting and one split.
_COMPONENT = f"%.{VECTOR_DIGITS}g "


def _embedded(deps: StageDeps, ref: TurnRef, answer: LlmAnswer) -> LlmAnswer:
    """The answer with each memory's vector, from ONE embedding request for the turn, so the
    vectors are persisted with the result (the same statement) and no retry, redelivery or
    replay pays for them again. An answer already embedded with the current model (a kept
    answer, a reused result) is left as it is. An embedder outage never fails
    the turn: the result is persisted without vectors, and the memory service's backfill
    embeds the memories later."""
    embedder = deps.embedder
    memories = answer.result.get("memories") or []
    if embedder is None or not memories:
        return answer
    model = embedder.model
    # One request embeds every memory of the turn, so one vector of the model means the
    # answer was embedded already (a memory without one had a text the model knows nothing
    # of).
    if any((m.get("embedding") or {}).get("model") == model for m in memories):
        return answer
    try:
        vectors, tokens = embed_counted(embedder, [m["content"] for m in memories])
    except EmbeddingsUnavailable as exc:
        deps.metrics.embedding_request(ok=False, texts=len(memories))
        log.warning("turn %s: persisted without vectors (backfilled later): %s", ref, exc)
        return answer
    deps.metrics.embedding_request(ok=True, texts=len(memories))
    embedded = []
    for memory, vector in zip(memories, vectors, strict=True):
        item = {k: v for k, v in memory.items() if k != "embedding"}
        if any(vector):  # a text the model knows nothing of has no vector
            item["embedding"] = {
                "model": model,
                "vector": _rounded(vector),
            }
        embedded.append(item)
    return dataclasses.replace(
        answer,
        result={**answer.result, "memories": embedded},
        embedding_tokens=tokens,
        embedding_model=model,
    )


def _rounded(vector: Sequence[float]) -> list[float]:
    """Each component at :data:`VECTOR_DIGITS` significant digits (what ``float(f"{v:.7g}")``
    gives, for the whole vector at once)."""
    return list(map(float, (_COMPONENT * len(vector) % tuple(vector)).split()))


def _resolve_refs(
    deps: StageDeps, result: ExtractionResult, ids: Mapping[str, str]
) -> ExtractionResult:
    """The answer with each memory's ``replaces`` refs resolved to the ids of the memories
    the prompt listed under them; a ref the prompt did not list is dropped and counted."""
    resolved = unknown = 0
    memories: list[ExtractedMemory] = []
    for memory in result.memories:
        known = tuple(dict.fromkeys(ids[r] for r in memory.replaces if r in ids))
        unknown += sum(1 for r in memory.replaces if r not in ids)
        resolved += len(known)
        memories.append(memory.resolved(known))
    if resolved or unknown:
        deps.metrics.refs(resolved=resolved, unknown=unknown)
    if unknown:
        log.info("an answer named %d ref(s) the prompt did not list; dropped", unknown)
    return ExtractionResult(
        tuple(memories),
        result.prompt_tokens,
        result.completion_tokens,
        result.provider,
        result.model,
    )


def _persist(
    deps: StageDeps,
    ref: TurnRef,
    token: uuid.UUID,
    answer: LlmAnswer,
    delivery: Delivery | None,
    claim_ends: float,
) -> Persisted:
    """Store ``answer`` (first wins), retrying while the database is unavailable for up to
    ``deps.persist_retry_seconds``, and not past our claim (once it expires another delivery
    may take it and call the LLM). If that is not enough, the answer stays in this process
    for the message's retry, which takes over the claim (``delivery.abandoned_claim``)."""
    deadline = min(time.monotonic() + deps.persist_retry_seconds, claim_ends)
    pause, longest = PERSIST_BACKOFF_SECONDS
    while True:
        try:
            stored = deps.turns.persist_result(
                ref,
                token,
                answer.result,
                provider=answer.provider,
                model=answer.model,
                prompt_tokens=answer.prompt_tokens,
                completion_tokens=answer.completion_tokens,
                lease_seconds=deps.settings.extraction_lease_seconds,
                input_hash=answer.input_hash,
                reused=answer.reused,
                latency_ms=answer.latency_ms,
                embedding_tokens=answer.embedding_tokens,
                embedding_model=answer.embedding_model,
            )
        except DatabaseUnavailableError as exc:
            if time.monotonic() + pause > deadline:
                deps.turns.answers.put(ref, answer)
                if delivery is not None:
                    delivery.abandoned_claim = token
                log.warning(
                    "turn %s: answer kept for the retry, the database is unavailable: %s",
                    ref,
                    exc,
                )
                raise
            log.info("turn %s: persisting the answer again in %.1fs: %s", ref, pause, exc)
            time.sleep(pause)
            pause = min(pause * 2, longest)
            continue
        deps.turns.answers.discard(ref)
        if stored.budget_crossed is not None:
            deps.metrics.budget_threshold(str(ref.org_id), stored.budget_crossed)
            log.warning(
                "org %s reached %d%% of its token budget", ref.org_id, stored.budget_crossed
            )
        if stored.stored_now:
            deps.metrics.usage(
                str(ref.org_id),
                answer.model,
                llm_calls=0 if answer.reused else 1,
                input_tokens=answer.prompt_tokens,
                output_tokens=answer.completion_tokens,
                embedding_tokens=answer.embedding_tokens,
            )
        return stored


def _validated(result: ExtractionResult) -> dict[str, Any]:
    """The result in its persisted form, validated again: what is stored is what was checked.
    An invalid answer is an LLM failure to retry (a bounded number of times), never "none"."""
    data = result.to_json()
    try:
        ExtractionResult.from_json(data)
    except InvalidMessageError as exc:
        raise LLMUnavailableError(f"invalid LLM result: {exc}") from exc
    return data


# -- write_memory ----------------------------------------------------------------------------


def memory_body(
    agent_id: uuid.UUID,
    ref: TurnRef,
    ordinal: int,
    result: PersistedResult,
    user_id: uuid.UUID | None = None,
) -> dict[str, Any]:
    """The POST body of one slot, built only from stored data: identical on every attempt.

    A session with a user writes memories about that user: ``user_id`` is part of the
    memory's scope (never of its idempotency key), and is left out for an agent-wide session,
    whose body is then exactly what it was before users existed."""
    memory = result.memories[ordinal]
    body: dict[str, Any] = {
        "agent_id": str(agent_id),
        "content": memory.content,
        "kind": memory.kind,
        "source": {
            "session_id": str(ref.session_id),
            "turn_index": ref.turn_index,
            "ordinal": ordinal,
        },
        "metadata": {"provider": result.provider, "model": result.model},
    }
    if user_id is not None:
        body["user_id"] = str(user_id)
    if memory.embedding is not None:
        # Computed in the extract stage and persisted with the result: the same vector on
        # every attempt, and outside the idempotency fingerprint.
        body["embedding"] = memory.embedding
    if memory.supersedes:
        # Decided when the result was persisted; a memory superseded or deleted since is left
        # as it is (skip), and this memory is stored all the same.
        body["supersedes"] = list(memory.supersedes)
        body["stale_supersedes"] = "skip"
    return body


def _outcome_label(outcome: WriteResultLike) -> str:
    if outcome.code:
        return outcome.code.lower()
    return "replayed" if outcome.replayed else "created"


def write_memory(
    deps: StageDeps,
    org_id: uuid.UUID | str,
    session_id: uuid.UUID | str,
    turn_index: int,
    ordinal: int,
) -> list[Send]:
    """POST one slot under its identity key unless it is recorded, record it, and when the
    turn's last slot is recorded, hand over to ``advance_pointer``."""
    ref = TurnRef.of(org_id, session_id, turn_index)
    # The first delivery of a slot after this process persisted the turn needs no read: the
    # stored result and the agent are immutable. Should the slot be recorded already (two
    # deliveries at once), the POST is answered as a replay and record_slot keeps the first
    # record; a done turn's record_slot returns False, so advance_pointer is not sent again.
    cached = deps.turns.slot_cache.take(ref, ordinal)
    if cached is not None:
        agent_id, user_id, result = cached
        recorded = False
    else:
        view = deps.turns.load_slot(ref, ordinal)
        if view.state == "done":
            return []
        if view.result is None:
            raise RowNotFoundError(
                f"turn {ref.turn_index} of {ref.session_id} has no stored result"
            )
        agent_id, user_id, result = view.agent_id, view.user_id, view.result
        recorded = view.recorded
    if ordinal >= len(result.memories):
        raise RowNotFoundError(
            f"turn {ref.turn_index} of {ref.session_id} has {len(result.memories)}"
            f" memories, no ordinal {ordinal}"
        )
    key = idempotency_key(ref.org_id, ref.session_id, ref.turn_index, ordinal)
    memory_id: uuid.UUID | None = None
    label = "recorded"
    if not recorded:
        try:
            outcome = deps.need_memory().create_memory(
                ref.org_id, memory_body(agent_id, ref, ordinal, result, user_id), key
            )
        except (MemoryUnavailableError, MemoryRejectedError) as exc:
            deps.metrics.memory_write(exc.status, exc.code)
            if isinstance(exc, MemoryUnavailableError):
                # The retry is this message's job; without this, every lease expiry during a
                # long outage would have the scan fan the turn's writes out once more.
                try:
                    deps.turns.keep_leased(
                        ref, deps.settings.extraction_lease_seconds, _describe(exc)
                    )
                except Exception:
                    log.warning("could not extend the lease of %s", ref, exc_info=True)
            raise
        deps.metrics.memory_write(outcome.status, outcome.code)
        deps.crash_point("after_post")
        memory_id, label = outcome.memory_id, _outcome_label(outcome)
    complete = deps.turns.record_slot(
        ref, ordinal, idempotency_key=key, memory_id=memory_id, outcome=label
    )
    deps.crash_point("after_record_slot")
    return [Send(ActorName.POINTER, ref.as_message())] if complete else []


# -- advance_pointer -------------------------------------------------------------------------


def complete_turn(
    deps: StageDeps, org_id: uuid.UUID | str, session_id: uuid.UUID | str, turn_index: int
) -> list[Send]:
    """The ``advance_pointer`` stage: mark the turn done (if every slot is recorded) and move
    the session pointer over every turn done without a gap. Sends nothing."""
    ref = TurnRef.of(org_id, session_id, turn_index)
    outcome = deps.turns.complete_turn(ref, fault=deps.fault)
    if outcome.newly_done:
        deps.metrics.turn_done()
    deps.crash_point("after_advance")
    if outcome.pointer_after != outcome.pointer_before:
        log.info(
            "pointer of %s: %d -> %d", ref.session_id, outcome.pointer_before, outcome.pointer_after
        )
    return []


__all__ = [
    "Delivery",
    "ExtractionAbandonedError",
    "MemoryWriter",
    "ProviderLike",
    "ScanReport",
    "Send",
    "StageDeps",
    "complete_turn",
    "extract_turn",
    "memory_body",
    "scan",
    "write_memory",
]
