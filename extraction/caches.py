"""What a worker process keeps in memory between two stages of one turn. Neither is a source
of truth: a miss always falls back to the per-turn state in Postgres."""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict

from extraction.values import LlmAnswer, PersistedResult, TurnRef


class SlotCache:
    """What ``write_memory`` needs for the first delivery of each slot, kept in-process after
    this process persisted the turn's result: the stored result and the session's agent and
    user, as the persisting statement read them. Each ordinal is handed out once
    (:meth:`take`); every later delivery of a slot (a retry, a redelivery, a replay) misses and
    reads the database as before. Bounded (least recently filled turns dropped first) and
    thread-safe."""

    def __init__(self, max_turns: int = 4096) -> None:
        self.max_turns = max_turns
        self._lock = threading.Lock()
        self._turns: OrderedDict[
            tuple[uuid.UUID, uuid.UUID, int],
            tuple[uuid.UUID, uuid.UUID | None, PersistedResult, set[int]],
        ] = OrderedDict()

    def put(
        self,
        ref: TurnRef,
        agent_id: uuid.UUID,
        user_id: uuid.UUID | None,
        result: PersistedResult,
    ) -> None:
        key = (ref.org_id, ref.session_id, ref.turn_index)
        with self._lock:
            self._turns[key] = (agent_id, user_id, result, set(range(len(result.memories))))
            self._turns.move_to_end(key)
            while len(self._turns) > self.max_turns:
                self._turns.popitem(last=False)

    def take(
        self, ref: TurnRef, ordinal: int
    ) -> tuple[uuid.UUID, uuid.UUID | None, PersistedResult] | None:
        """(agent, user, result) for the first delivery of ``ordinal``, else None."""
        key = (ref.org_id, ref.session_id, ref.turn_index)
        with self._lock:
            entry = self._turns.get(key)
            if entry is None or ordinal not in entry[3]:
                return None
            entry[3].discard(ordinal)
            if not entry[3]:
                del self._turns[key]
            return entry[0], entry[1], entry[2]

    def __len__(self) -> int:
        with self._lock:
            return len(self._turns)


class AnswerCache:
    """LLM answers this process holds but could not persist (the database was unavailable
    through the stage's bounded retries). The retry of the message that paid for an answer
    persists it from here instead of calling the LLM again. Bounded (oldest dropped first),
    thread-safe; an entry goes once its turn has a stored result."""

    def __init__(self, max_turns: int = 1024) -> None:
        self.max_turns = max_turns
        self._lock = threading.Lock()
        self._answers: OrderedDict[TurnRef, LlmAnswer] = OrderedDict()

    def put(self, ref: TurnRef, answer: LlmAnswer) -> None:
        with self._lock:
            self._answers[ref] = answer
            self._answers.move_to_end(ref)
            while len(self._answers) > self.max_turns:
                self._answers.popitem(last=False)

    def get(self, ref: TurnRef) -> LlmAnswer | None:
        with self._lock:
            return self._answers.get(ref)

    def discard(self, ref: TurnRef) -> None:
        with self._lock:
            self._answers.pop(ref, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._answers)


__all__ = ["AnswerCache", "SlotCache"]
