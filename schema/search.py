"""Payloads of the read path: ``POST /v1/memories/search`` and ``POST /v1/context``.

Scores and signals are in ``[0, 1]`` and higher is better on every backend; how each is
computed is documented on the fields (and in ``memories.search.store``). No I/O here.
"""

from __future__ import annotations

from typing import Any

from marshmallow import RAISE, Schema, ValidationError, fields, validate, validates_schema

from schema.common import Slug, StrictInteger, StrictNumber
from schema.memory import (
    MEMORY_KINDS,
    NOT_BLANK_PATTERN,
    STORABLE_PATTERN,
    MemorySchema,
    _storable_text,
)
from schema.users import (
    UserReadFields,
)

MAX_SEARCH_LIMIT = 50
DEFAULT_SEARCH_LIMIT = 10
MAX_QUERY_CHARS = 2000
MIN_CONTEXT_TOKENS = 1
MAX_CONTEXT_TOKENS = 32_000
DEFAULT_CONTEXT_TOKENS = 400
MAX_CONTEXT_MESSAGES = 50
MAX_MESSAGE_CHARS = 20_000


AGENT_DESCRIPTION = "The agent's slug (instead of agent_id); 404 UNKNOWN_AGENT if the org has none."
AGENT_ID_DESCRIPTION = "The agent's id (instead of agent); 404 UNKNOWN_AGENT if not the org's."


def _one_agent(data: dict[str, Any]) -> None:
    if ("agent" in data) == ("agent_id" in data):
        raise ValidationError("give exactly one of agent (a slug) and agent_id", "agent")


def _query_valid(text: str) -> None:
    _storable_text(text)
    if not text.split():
        raise ValidationError("must not be blank")


class SearchRequestSchema(UserReadFields):
    """Body of ``POST /v1/memories/search``."""

    class Meta:
        unknown = RAISE

    query = fields.String(
        required=True,
        validate=[validate.Length(min=1, max=MAX_QUERY_CHARS), _query_valid],
        metadata={
            "description": "Free text: a question, a name, a few words.",
            "pattern": NOT_BLANK_PATTERN,
        },
    )
    agent = Slug(metadata={"description": AGENT_DESCRIPTION})
    agent_id = fields.UUID(metadata={"description": AGENT_ID_DESCRIPTION})
    session_id = fields.UUID(
        load_default=None,
        allow_none=True,
        metadata={"description": "Only memories extracted from this session."},
    )
    kinds = fields.List(
        fields.String(validate=validate.OneOf(MEMORY_KINDS)),
        load_default=None,
        allow_none=True,
        validate=validate.Length(min=1, max=len(MEMORY_KINDS)),
        metadata={"description": "Only memories of these kinds."},
    )
    limit = StrictInteger(
        load_default=DEFAULT_SEARCH_LIMIT,
        validate=validate.Range(min=1, max=MAX_SEARCH_LIMIT),
    )
    # Supersession (migration 000014): current memories unless asked for.
    include_superseded = fields.Boolean(
        load_default=False,
        metadata={"description": "Also return superseded memories (with their superseded_by)."},
    )
    min_score = StrictNumber(
        load_default=0.0,
        validate=validate.Range(min=0, max=1),
        metadata={
            "description": "Only hits whose score is at least this (0-1, default 0: every "
            "hit). Raise it to trade recall for precision: a memory that shares no word "
            "with the query and is only among the nearest by meaning scores low."
        },
    )

    @validates_schema
    def _one_agent(self, data: dict[str, Any], **kwargs: Any) -> None:
        _one_agent(data)


class SignalsSchema(Schema):
    """The per-signal scores behind ``score``, each in ``[0, 1]``, higher is better."""

    class Meta:
        unknown = RAISE

    text = fields.Float(
        required=True,
        metadata={
            "description": "Full-text rank: 0.8 x the IDF-weighted share of the query's "
            "stemmed words the memory contains + 0.2 x r/(r+1), r = ts_rank_cd divided by "
            "the memory's length in words."
        },
    )
    trigram = fields.Float(
        required=True,
        metadata={
            "description": "Mean over the query's significant words of pg_trgm "
            "word_similarity(word, content); 0 where pg_trgm is not installed."
        },
    )
    recency = fields.Float(
        required=True,
        metadata={"description": "1 / (1 + age in days / 30); breaks ties of score."},
    )
    semantic = fields.Float(
        required=True,
        allow_none=True,
        metadata={
            "description": "Cosine similarity of the memory's vector to the query's (same "
            "embedding model), clipped to [0, 1]; null when not available: no embedder, the "
            "embedder failed for this search (see details), or the memory has no vector yet."
        },
    )


class SearchHitSchema(MemorySchema):
    """A memory with why it matched."""

    score = fields.Float(
        required=True,
        metadata={
            "description": "lexical + w x bonus x (1 - lexical), in [0, 1], higher is "
            "better; lexical = 0.75 x text + 0.25 x trigram (text alone without pg_trgm), "
            "bonus = max(0, (semantic - floor) / (1 - floor)), w and floor calibrated per "
            "embedding model (docs/search.md); exactly lexical when semantic is null."
        },
    )
    signals = fields.Nested(SignalsSchema, required=True)
    snippet = fields.String(
        required=True,
        metadata={"description": "The content with the matched words between <mark> and </mark>."},
    )


class AnswerDetailsSchema(Schema):
    """Present only when the answer was ranked with less than usual."""

    class Meta:
        unknown = RAISE

    semantic = fields.String(
        metadata={
            "description": "Why the semantic signal is missing from this answer (the embedder "
            "down, slow or answering badly): the ranking is full-text and trigram alone."
        }
    )


class SearchResultSchema(Schema):
    """The answer of ``POST /v1/memories/search``: best first."""

    class Meta:
        unknown = RAISE

    items = fields.List(fields.Nested(SearchHitSchema), required=True)
    details = fields.Nested(AnswerDetailsSchema)


class ContextMessageSchema(Schema):
    """One chat message (``content`` a string or a list of parts with ``text``)."""

    class Meta:
        unknown = RAISE

    role = fields.String(required=True, validate=validate.Length(min=1, max=64))
    content = fields.Raw(
        required=True,
        metadata={
            "description": "A string or a list of parts.",
            "anyOf": [
                {"type": "string", "pattern": STORABLE_PATTERN},
                {"type": "array", "items": {"type": "object"}},
            ],
        },
    )
    name = fields.String(validate=validate.Length(max=256))

    @validates_schema
    def _content_shape(self, data: dict[str, Any], **kwargs: Any) -> None:
        content = data.get("content")
        if isinstance(content, str):
            texts = [content]
        elif isinstance(content, list) and all(isinstance(p, dict) for p in content):
            texts = [p["text"] for p in content if isinstance(p.get("text"), str)]
        else:
            raise ValidationError("must be a string or a list of parts", "content")
        if sum(len(t) for t in texts) > MAX_MESSAGE_CHARS:
            raise ValidationError(f"at most {MAX_MESSAGE_CHARS} characters", "content")
        for text in texts:
            _storable_text(text)


class ContextRequestSchema(UserReadFields):
    """Body of ``POST /v1/context``: ``query``, or the conversation's last ``messages``."""

    class Meta:
        unknown = RAISE

    agent = Slug(metadata={"description": AGENT_DESCRIPTION})
    agent_id = fields.UUID(metadata={"description": AGENT_ID_DESCRIPTION})
    query = fields.String(
        load_default=None,
        allow_none=True,
        validate=[validate.Length(min=1, max=MAX_QUERY_CHARS), _query_valid],
        metadata={"pattern": NOT_BLANK_PATTERN},
    )
    messages = fields.List(
        fields.Nested(ContextMessageSchema),
        load_default=None,
        allow_none=True,
        validate=validate.Length(min=1, max=MAX_CONTEXT_MESSAGES),
        metadata={
            "description": "The last messages; the query is made of the last user messages "
            "(recalled <memories> blocks removed)."
        },
    )
    session_id = fields.UUID(load_default=None, allow_none=True)
    # Supersession (migration 000014): current memories unless asked for.
    include_superseded = fields.Boolean(
        load_default=False,
        metadata={"description": "Also return superseded memories (with their superseded_by)."},
    )
    kinds = fields.List(
        fields.String(validate=validate.OneOf(MEMORY_KINDS)),
        load_default=None,
        allow_none=True,
        validate=validate.Length(min=1, max=len(MEMORY_KINDS)),
    )
    max_tokens = StrictInteger(
        load_default=DEFAULT_CONTEXT_TOKENS,
        validate=validate.Range(min=MIN_CONTEXT_TOKENS, max=MAX_CONTEXT_TOKENS),
        metadata={
            "description": "Budget of the context block, in estimated tokens (one per 4 "
            "UTF-8 bytes, rounded up); never exceeded."
        },
    )

    @validates_schema
    def _one_source(self, data: dict[str, Any], **kwargs: Any) -> None:
        if (data.get("query") is None) == (data.get("messages") is None):
            raise ValidationError("give exactly one of query and messages", "query")

    @validates_schema
    def _one_agent(self, data: dict[str, Any], **kwargs: Any) -> None:
        _one_agent(data)


class ContextResultSchema(Schema):
    """The answer of ``POST /v1/context``."""

    class Meta:
        unknown = RAISE

    context = fields.String(
        required=True,
        metadata={
            "description": 'A "<memories>" block, one "- " line per memory, ready for a '
            'system prompt; "" when no memory fits or matches.'
        },
    )
    memories = fields.List(
        fields.Nested(SearchHitSchema),
        required=True,
        metadata={"description": "The memories packed, in the block's order."},
    )
    tokens = fields.Integer(
        required=True, metadata={"description": "Estimated tokens of context, <= max_tokens."}
    )
    dropped = fields.Integer(
        required=True,
        metadata={
            "description": "Matching memories left out: over the budget or near-duplicates "
            "of one packed."
        },
    )
    details = fields.Nested(AnswerDetailsSchema)
