"""The memories flows: ``create(org, key, document) -> Outcome``, and the reads and deletes.

No Falcon and no request: each outcome of a create carries the answer it gives (status, body,
headers) as bytes, because a replay must give the response first given byte for byte; reads
and deletes raise :class:`~memories.errors.MemoryNotFoundError`, which the app
maps onto HTTP in one place.

In order: validate the document (a 422 outcome field by field), fingerprint the validated body,
and only then touch the idempotency key, because the fingerprint is taken over the validated
body; so a document that fails validation never claims, and never consumes, its key.

With a key, the Redis record (:mod:`memories.idempotency`) is claimed first:

- another fingerprint under the key is a conflict; a finished record answers as it records
  (a created memory is replayed from its row, read by key from Postgres; a 409 is rebuilt
  from the memory id it names); a live lease answers "in progress" with a retry-after;
- otherwise this request runs the write. When a previous owner died or stalled past its
  lease (the record then expired with the lease) it may have committed: the write answers
  with the row holding the key when there is one. The decided answer is stored under the key
  (``complete``) when it is one the key keeps (its
  :class:`~memories.idempotency.StoredAnswer`), else the key is freed (``release``), and
  freed as well when the write raised, so a 5xx never consumes a key;
- when Redis is unavailable the write runs on the Postgres keys alone: the unique constraints
  still allow one row per key and per content, so a repeat is answered from the row.

Every outcome knows its response (status, body, headers) byte for byte, and a replay gives the
response first given: the row and the memory id determine it. Outcomes are counted in the
service's metrics here, once.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Callable
from typing import Any, TypeAlias

from marshmallow import ValidationError

from core.errors import ConfigError, DatabaseUnavailableError, EmbeddingsUnavailable
from embeddings import Embedder
from memories.auth import Principal
from memories.canonical import canonical_request, content_hash, fingerprint_digest
from memories.errors import MemoryNotFoundError
from memories.idempotency import (
    Claim,
    ClaimState,
    IdempotencyStore,
    KeyAnswer,
    StoredAnswer,
)
from memories.metrics import MemoryMetrics
from memories.outcomes import (
    Created,
    DuplicateContent,
    InProgress,
    Invalid,
    KeyConflict,
    Outcome,
    Replayed,
    UnknownOrg,
    for_key_row,
    stored_answer,
)
from memories.pending_vectors import PendingVectors
from memories.scope import AGENT_WIDE, ReadScope, UserRef
from memories.store import MemoryRow, MemoryStore, NewMemory, WriteOutcome
from memories.users import UserService
from memories.validation import quick_load_create
from memories.vectors import EmbeddingStore, unit_array_literal, unit_literal
from schema.memory import MemoryCreateSchema

log = logging.getLogger(__name__)

# Built once: a marshmallow Schema is costly to instantiate and safe to share for load().
CREATE_SCHEMA = MemoryCreateSchema()


#: Makes the model and ``real[]`` text of a content's vector in the request (None: none).
EmbedContent: TypeAlias = Callable[[str], tuple[str, str] | None]


def new_memory(
    validated: dict[str, Any], key: str | None, embed: EmbedContent | None = None
) -> NewMemory:
    """The write of a validated body, with its content hash and request fingerprint. The
    ``embedding`` is not part of the fingerprint (:func:`canonical_request` leaves it out), so
    a body with a vector and the same body without one are the same request. ``embed``: for
    a body without a vector (or with one of no direction), the vector made in the request."""
    canonical = canonical_request(validated)
    embedding = validated.get("embedding")
    model: str | None = None
    vector: str | None = None
    if embedding:
        vector = unit_literal(embedding["vector"])
        model = embedding["model"] if vector else None
    if vector is None and embed is not None:
        made = embed(validated["content"])
        if made is not None:
            model, vector = made
    source = canonical["source"] or {}
    return NewMemory(
        agent_id=validated["agent_id"],
        content=validated["content"],
        content_hash=content_hash(validated["content"]),
        kind=validated["kind"],
        metadata=validated["metadata"],
        session_id=validated["source"]["session_id"] if validated["source"] else None,
        turn_index=source.get("turn_index"),
        ordinal=source.get("ordinal"),
        idempotency_key=key,
        fingerprint=fingerprint_digest(canonical),
        user_id=validated.get("user_id"),
        supersedes=tuple(dict.fromkeys(validated.get("supersedes") or ())),
        skip_stale=validated.get("stale_supersedes") == "skip",
        embedding_model=model,
        embedding=vector,
    )


#: Whether the org has a live session with this id, and its user (None: agent-wide).
SessionUser: TypeAlias = Callable[[uuid.UUID, uuid.UUID], tuple[bool, uuid.UUID | None]]
#: The answer for a source session the writer may not name, whether or not it exists.
UNKNOWN_SESSION = {"source": {"session_id": ["unknown session for this org"]}}


class MemoryService:
    """Creates memories exactly once per idempotency key and per content; reads and deletes
    them."""

    def __init__(
        self,
        store: MemoryStore,
        idempotency: IdempotencyStore,
        metrics: MemoryMetrics,
        users: UserService | None = None,
        embedder: Embedder | None = None,
        embeddings: EmbeddingStore | None = None,
        session_user: SessionUser | None = None,
        pending: PendingVectors | None = None,
    ) -> None:
        self.store = store
        #: Whether a session of the org exists and whose it is: a user-bound token may name
        #: only its user's sessions as a source (another's, or an agent-wide one, is
        #: answered as an unknown session).
        self.session_user = session_user
        self.idempotency = idempotency
        self.metrics = metrics
        self.users = users
        #: The configured model: a vector in a body must be of its model and dimension.
        self.embedder = embedder
        self.embeddings = embeddings
        #: Embeds the memories created without a vector, after their commit, in batches
        #: (best effort: the scheduler's backfill embeds what it leaves lexical).
        self.pending = pending
        #: Whether the embedder's model is known registered (create_app registers it at start;
        #: when the database was away then, the first write with a vector does).
        self._registered = False

    def create(
        self,
        org_id: uuid.UUID,
        key: str | None,
        document: Any,
        principal: Principal | None = None,
    ) -> Outcome:
        """Create the memory ``document`` (parsed JSON) describes for ``org_id``, under the
        idempotency ``key`` if given. Its user is the one it names (``user``, a key created
        when missing, or ``user_id``) or a user-bound ``principal``'s, resolved before the
        fingerprint is taken; naming another user than a bound token's raises
        ``UserForbiddenError``. Raises only what it could not decide (the database
        unavailable): the key is then free again."""
        validated = quick_load_create(document)
        if validated is None:  # anything unusual, and every 422, goes through marshmallow
            try:
                validated = CREATE_SCHEMA.load(document)
            except ValidationError as exc:
                return Invalid(exc.messages)
        validated, refused = self._vector_accepted(validated)
        if refused is not None:
            return refused
        named = UserRef.of(validated)
        bound = principal is not None and principal.user_id is not None
        if (named.key is not None or bound) and self.users is not None and principal is not None:
            validated = {
                **validated,
                "user_id": self.users.writer(principal, org_id, named),
            }
        if bound and validated.get("source") and self.session_user is not None:
            assert principal is not None
            exists, owner = self.session_user(org_id, validated["source"]["session_id"])
            if not exists or owner != principal.user_id:
                return Invalid(UNKNOWN_SESSION)
        new = new_memory(validated, key, self._embed_in_process)
        outcome = self._create(org_id, new)
        self._count(outcome)
        if isinstance(outcome, Created) and new.embedding is None and self.pending is not None:
            # A remote embedder's (or a failed inline one's): after the commit, in a batch.
            self.pending.add(org_id, outcome.row.id, outcome.row.content)
        return outcome

    def _vector_accepted(self, validated: dict[str, Any]) -> tuple[dict[str, Any], Invalid | None]:
        """The body's vector, if any, judged against this service's embedder: one of the
        configured model and dimension is stored with the memory (the model is registered
        first); another one is a 422, so no request decides which models or dimensions the
        service holds; without an embedder the service does no semantic search and stores no
        vector (the body is written without it; the vector is not part of the fingerprint)."""
        embedding = validated.get("embedding")
        if not embedding:
            return validated, None
        if self.embedder is None:
            return {k: v for k, v in validated.items() if k != "embedding"}, None
        model, dimension = self.embedder.model, self.embedder.dimension
        if embedding["model"] != model or len(embedding["vector"]) != dimension:
            message = f"this service stores vectors of model {model!r}, {dimension} dimensions"
            return validated, Invalid({"embedding": {"model": [message]}})
        if not self._registered:
            try:
                self.register_model()
            except (DatabaseUnavailableError, ConfigError) as exc:
                # Stored without its vector (the backfill embeds it later).
                log.warning("embedding model not registered (%s); memory stored lexical", exc)
                return {k: v for k, v in validated.items() if k != "embedding"}, None
        return validated, None

    def register_model(self) -> None:
        """Register the embedder's model and dimension (:meth:`EmbeddingStore.register`);
        raises its errors. A no-op without an embedder."""
        if self.embedder is None or self.embeddings is None:
            return
        self._registered = self.embeddings.register(self.embedder.model, self.embedder.dimension)

    def _embed_in_process(self, content: str) -> tuple[str, str] | None:
        """With an in-process embedder (``EMBEDDINGS_PROVIDER=local``: no network), the model
        and ``real[]`` text of the vector of a memory written without one, so that it goes in
        with the row: one statement and one commit instead of a second of each after the
        insert. The model's array is already of length 1 in ``real`` precision, the values
        ``embed`` gives: it is written as it is. (In a batch after the commit the web would
        spend less a vector, its caches warm for the batch, but storing the batch cost
        Postgres more than this insert saves: docs/benchmarks.md.) A remote embedder is
        called after the commit, with the other writes of the moment (:attr:`pending`), so
        that no write waits for an endpoint. Either way a failure leaves the memory lexical,
        never fails it. None: nothing to store with the row (:data:`EmbedContent`)."""
        embed_array = (
            getattr(self.embedder, "embed_array", None)
            if getattr(self.embedder, "in_process", False)
            else None
        )
        if embed_array is None:
            return None
        try:
            literal = unit_array_literal(embed_array(content))
        except EmbeddingsUnavailable:
            return None  # stored lexical; the batch after the commit tries again
        if literal is None:
            return None
        assert self.embedder is not None
        return self.embedder.model, literal

    def get(
        self, org_id: uuid.UUID, memory_id: uuid.UUID, scope: ReadScope = AGENT_WIDE
    ) -> MemoryRow:
        """The live memory, if it is in the reader's ``scope`` (else not found)."""
        row = self.store.get(org_id, memory_id, scope)
        if row is None:
            raise MemoryNotFoundError()
        return row

    def history(
        self, org_id: uuid.UUID, memory_id: uuid.UUID, scope: ReadScope = AGENT_WIDE
    ) -> list[MemoryRow]:
        """The supersession chain of a memory, oldest first (the memory itself included), if
        it is in the reader's ``scope`` (else not found)."""
        rows = self.store.history(org_id, memory_id, scope)
        if not rows:
            raise MemoryNotFoundError()
        return rows

    def list(self, org_id: uuid.UUID, **filters: Any) -> list[MemoryRow]:
        """The org's live memories, newest first (:meth:`MemoryStore.list`'s filters)."""
        return self.store.list(org_id, **filters)

    def delete(self, org_id: uuid.UUID, memory_id: uuid.UUID, scope: ReadScope) -> None:
        """Soft-delete the memory if it is in ``scope`` (whose memories the deleter reaches:
        :meth:`~memories.users.UserService.deleter_of`); else not found."""
        if scope.empty or not self.store.soft_delete(org_id, memory_id, scope):
            raise MemoryNotFoundError()

    def _create(self, org_id: uuid.UUID, new: NewMemory) -> Outcome:
        key = new.idempotency_key
        if key is None:
            return self._write(org_id, new)
        claim = self.idempotency.claim(org_id, key, new.fingerprint)
        if claim.state is ClaimState.CONFLICT:
            return KeyConflict()
        if claim.state is ClaimState.RUNNING:
            return InProgress(max(1, math.ceil(claim.retry_after_ms / 1000)))
        if claim.state is ClaimState.DONE:
            assert claim.stored is not None
            return self._answer(org_id, key, new, claim.stored)
        if claim.state is ClaimState.UNAVAILABLE:
            self.metrics.idempotency_unavailable.inc()
        return self._run_claimed(org_id, new, claim)

    def _answer(self, org_id: uuid.UUID, key: str, new: NewMemory, stored: StoredAnswer) -> Outcome:
        """The answer a finished record gives (its fingerprint matched this request's)."""
        if stored.answer is KeyAnswer.DUPLICATE:
            return Replayed(DuplicateContent(stored.memory_id), "redis")
        if stored.answer is KeyAnswer.CONFLICT:
            return Replayed(KeyConflict(stored.memory_id), "redis")
        row = self.store.find_by_key(org_id, key)
        if row is None:
            # The row is gone (an org or session purge): the write decides on Postgres alone,
            # as when the record is lost.
            return self._write(org_id, new)
        return for_key_row(row, new.fingerprint, "redis")

    def _run_claimed(self, org_id: uuid.UUID, new: NewMemory, claim: Claim) -> Outcome:
        try:
            # A previous owner of the key may have committed before its lease ended: the
            # write then answers with the row holding the key (a replay or a conflict).
            outcome = self._write(org_id, new)
        except Exception:
            # Nothing stored for this key (5xx, or a failure we did not decide): free it.
            if claim.owned:
                self.idempotency.release(claim)
            raise
        if claim.owned:
            stored = stored_answer(outcome)
            if stored is not None:
                if not self.idempotency.complete(claim, stored):
                    log.info("idempotency record %s is no longer ours; not completing", claim.key)
            else:
                self.idempotency.release(claim)
        return outcome

    def _write(self, org_id: uuid.UUID, new: NewMemory) -> Outcome:
        result = self.store.create(org_id, new)
        row = result.row
        if result.outcome is WriteOutcome.CREATED:
            assert row is not None
            if result.marked:
                self.metrics.supersessions.inc(len(result.marked))
            return Created(row)
        if result.outcome is WriteOutcome.KEY_EXISTS:
            assert row is not None
            return for_key_row(row, new.fingerprint)
        if result.outcome is WriteOutcome.CONTENT_EXISTS:
            assert row is not None
            return DuplicateContent(row.id)
        if result.outcome is WriteOutcome.NEAR_DUPLICATE:
            assert row is not None
            return DuplicateContent(row.id, near=True)
        if result.outcome is WriteOutcome.SUPERSEDES_INVALID:
            refused = ", ".join(str(i) for i in result.refused)
            return Invalid(
                {
                    "supersedes": [
                        "must be current memories of the same agent and user; not: " + refused
                    ]
                }
            )
        if result.outcome is WriteOutcome.UNKNOWN_ORG:
            return UnknownOrg()
        if result.outcome is WriteOutcome.UNKNOWN_SESSION:
            return Invalid(UNKNOWN_SESSION)
        if result.outcome is WriteOutcome.UNKNOWN_USER:
            return Invalid({"user_id": ["unknown user for this org"]})
        if result.outcome is WriteOutcome.NOT_THE_SESSIONS_USER:
            return Invalid({"user_id": ["must be the user of the source session"]})
        return Invalid({"agent_id": ["unknown agent for this org"]})

    def _count(self, outcome: Outcome) -> None:
        metrics = self.metrics
        if isinstance(outcome, Replayed):
            metrics.replays.labels(outcome.source).inc()
        elif isinstance(outcome, KeyConflict):
            metrics.conflicts.labels("IDEMPOTENCY_CONFLICT").inc()
        elif isinstance(outcome, InProgress):
            metrics.conflicts.labels("IDEMPOTENCY_IN_PROGRESS").inc()
        elif isinstance(outcome, DuplicateContent):
            metrics.conflicts.labels("DUPLICATE_CONTENT").inc()
            if outcome.near:
                metrics.near_duplicates.inc()
