"""The workers' message encoder (actors.broker.MessageEncoder): Dramatiq's JSON, written and
read by orjson, with Dramatiq's own answers for what orjson would not read alike."""

from __future__ import annotations

import json
import uuid
from typing import Any

import dramatiq
import pytest
from dramatiq.encoder import JSONEncoder
from dramatiq.errors import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.broker import MessageEncoder

ENCODER, DRAMATIQ = MessageEncoder(), JSONEncoder()

options = st.dictionaries(
    st.text(max_size=10),
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False),
        st.text(),  # lone surrogates included: an exception's text in a traceback
    ),
    max_size=6,
)


def message(options: dict[str, Any]) -> dict[str, Any]:
    kwargs = {"org_id": str(uuid.uuid4()), "session_id": str(uuid.uuid4()), "turn_index": 3}
    return dramatiq.Message(
        queue_name="extract", actor_name="extract_turn", args=(), kwargs=kwargs, options=options
    ).asdict()


@settings(max_examples=300, deadline=None)
@given(options)
def test_a_message_reads_back_as_dramatiqs_encoder_reads_it(extra: dict[str, Any]) -> None:
    data = message(extra)
    written = ENCODER.encode(data)
    assert ENCODER.decode(written) == DRAMATIQ.decode(DRAMATIQ.encode(data))
    assert DRAMATIQ.decode(written) == ENCODER.decode(written)  # an older worker reads it
    assert ENCODER.decode(DRAMATIQ.encode(data)) == DRAMATIQ.decode(DRAMATIQ.encode(data))


def test_a_usual_message_is_dramatiqs_json_without_escapes() -> None:
    data = message({"redis_message_id": "r-1", "traceback": "Fehler: Größe"})
    assert ENCODER.encode(data) == json.dumps(
        data, separators=(",", ":"), ensure_ascii=False
    ).encode("utf-8")


@pytest.mark.parametrize(
    "payload", [b"{not json", b"\xff\xfe", b'{"a": NaN', b"", b'["unterminated']
)
def test_what_dramatiq_refuses_is_refused_with_its_error(payload: bytes) -> None:
    with pytest.raises(DecodeError) as ours:
        ENCODER.decode(payload)
    with pytest.raises(DecodeError) as theirs:
        DRAMATIQ.decode(payload)
    assert str(ours.value) == str(theirs.value)


def test_what_orjson_reads_otherwise_is_read_by_dramatiqs_decoder() -> None:
    for payload in (b'{"retries": NaN}', b'{"eta": 123456789012345678901234567890}'):
        assert repr(ENCODER.decode(payload)) == repr(DRAMATIQ.decode(payload))


def test_the_workers_use_it() -> None:
    import actors.broker  # noqa: F401 - installs it

    assert isinstance(dramatiq.get_encoder(), MessageEncoder)
