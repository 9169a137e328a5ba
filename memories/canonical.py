"""Canonical forms: normalised content, its hash, the canonical request and its fingerprint.

Pure functions, no I/O. Both hashes are part of the service's durable state (stored on every
row), so changing either changes which requests count as "the same": treat them as a format.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Mapping
from typing import Any

from core.canonical import canonical_bytes, canonical_json

#: The request a fingerprint describes; only one route takes an idempotency key today.
CREATE_ROUTE = "POST|/v1/memories|"
_CREATE_ROUTE_BYTES = CREATE_ROUTE.encode("utf-8")


def normalize_content(text: str) -> str:
    """NFKC, case-folded, whitespace runs collapsed to one space and trimmed.

    NFKC is applied again after case folding because folding can produce sequences that are
    not in NFKC (the Unicode NFKC_Casefold recipe), and NFKC can turn characters such as
    U+00A0 into plain spaces, so whitespace is collapsed last.
    """
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    return " ".join(folded.split())


def content_hash(text: str) -> str:
    """SHA-256 (hex) of the normalised content: equal for texts that differ only in form."""
    return hashlib.sha256(normalize_content(text).encode("utf-8")).hexdigest()


def canonical_request(validated: Mapping[str, Any]) -> dict[str, Any]:
    """The validated body as plain JSON, every optional field present: what is fingerprinted.

    ``user_id`` is in it only when the memory has a user, so a body without one has the
    fingerprint it had before users existed, and the same key with another user conflicts."""
    source = validated["source"]
    canonical: dict[str, Any] = {
        "agent_id": str(validated["agent_id"]),
        "content": validated["content"],
        "kind": validated["kind"],
        "metadata": validated["metadata"],
        "source": None
        if source is None
        else {
            "session_id": str(source["session_id"]),
            "turn_index": source["turn_index"],
            "ordinal": source["ordinal"],
        },
    }
    # Supersession: only when given, so every fingerprint stored before stays valid. The ids
    # as a set (sorted, once each): their order says nothing.
    if validated.get("supersedes"):
        canonical["supersedes"] = sorted({str(i) for i in validated["supersedes"]})
    if validated.get("stale_supersedes") is not None:
        canonical["stale_supersedes"] = validated["stale_supersedes"]
    if validated.get("user_id") is not None:
        canonical["user_id"] = str(validated["user_id"])
    return canonical


def fingerprint(validated_body: Mapping[str, Any]) -> str:
    """``POST|/v1/memories|`` + the canonical JSON of the validated body.

    Computed over the validated body, never the raw bytes, so key order, whitespace and
    escapes do not matter, while any change of value does.
    """
    return CREATE_ROUTE + canonical_json(validated_body)


def fingerprint_digest(validated_body: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of :func:`fingerprint`: what Redis and the row store, at a fixed size."""
    return hashlib.sha256(_CREATE_ROUTE_BYTES + canonical_bytes(validated_body)).hexdigest()
