"""The transport's header parse (core.http.parse_headers) reads the message http.client's
own parse reads from the same bytes, and the transport's answers use it."""

from __future__ import annotations

import http.client
import io
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core import http as core_http

TOKEN = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters=":"),
    min_size=1,
    max_size=12,
)
NAMES = st.one_of(TOKEN, st.sampled_from(["Content-Length", "Set-Cookie", "From", "bad name", ""]))
VALUES = st.one_of(
    st.text(alphabet=st.characters(max_codepoint=0xFF), max_size=30),  # any latin-1 byte
    st.sampled_from(["", " ", "\t x \t", "a\rb", "a\nb", "  keep trailing  "]),
)
ENDS = st.sampled_from(["\r\n", "\r\n", "\r\n", "\n", "\r"])
LINES = st.one_of(
    st.builds(lambda n, v, e: f"{n}:{v}{e}", NAMES, VALUES, ENDS),
    st.builds(lambda n, v, e: f"{n}: {v}{e}", NAMES, VALUES, ENDS),
    st.builds(lambda v, e: f" {v}{e}", VALUES, ENDS),  # a folded line
    st.sampled_from(["From someone\r\n", "no colon here\r\n", ":empty name\r\n"]),
)


def parsed(parse: Any, raw: bytes) -> tuple[Any, ...]:
    message = parse(io.BufferedReader(io.BytesIO(raw)))
    return (
        message.items(),
        message.get_payload(),
        [type(d) for d in message.defects],
        message.get_unixfrom(),
        type(message),
    )


@settings(max_examples=500, deadline=None)
@given(st.lists(LINES, max_size=8), st.sampled_from(["\r\n", "\n", ""]))
def test_it_reads_what_http_client_reads(lines: list[str], end: str) -> None:
    raw = ("".join(lines) + end).encode("latin-1") + b"the body, not read"
    assert parsed(core_http.parse_headers, raw) == parsed(http.client.parse_headers, raw)


def test_a_usual_answer_is_read_without_the_email_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = (
        b"date: Mon, 07 Dec 2026 16:00:00 GMT\r\nserver: gunicorn\r\n"
        b"content-type: application/json\r\ncontent-length: 2\r\nX-Two: a\r\nx-two: b \r\n\r\n{}"
    )
    expected = parsed(http.client.parse_headers, raw)
    monkeypatch.setattr(core_http.email.parser, "Parser", None)  # any use would fail
    assert parsed(core_http.parse_headers, raw) == expected
    fp = io.BufferedReader(io.BytesIO(raw))
    core_http.parse_headers(fp)
    assert fp.read() == b"{}"  # the body is left to read


def test_the_same_limits_and_errors() -> None:
    with pytest.raises(http.client.LineTooLong):
        core_http.parse_headers(io.BytesIO(b"a: " + b"x" * 70000 + b"\r\n\r\n"))
    with pytest.raises(http.client.HTTPException, match="more than 100 headers"):
        core_http.parse_headers(io.BytesIO(b"a: b\r\n" * 101 + b"\r\n"))


def test_the_transports_answers_are_parsed_by_it() -> None:
    assert core_http._Response.begin.__code__ is http.client.HTTPResponse.begin.__code__
    assert core_http._Response.begin.__globals__["parse_headers"] is core_http.parse_headers
