"""The cookieless HTTP clients: what one org's answer sets never rides on another's request."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import httpx
import pytest

from core.http import CookielessAsyncClient, CookielessClient
from extraction.memory_client import MemoryClient

SET_COOKIE = {"set-cookie": "__cf_bm=org-a-session; Path=/; HttpOnly"}


def recording(seen: list[str | None]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("cookie"))
        return httpx.Response(201, headers=SET_COOKIE, json={"id": str(uuid.uuid4())})

    return httpx.MockTransport(handler)


def test_a_plain_client_would_carry_the_cookie_to_the_next_request() -> None:
    # What the cookieless clients are for (and proof that the transport sets the cookie).
    seen: list[str | None] = []
    with httpx.Client(transport=recording(seen)) as client:
        client.get("http://llm.test/a")
        client.get("http://llm.test/b")
    assert seen == [None, "__cf_bm=org-a-session"]


def test_the_cookieless_client_neither_keeps_nor_sends_a_cookie() -> None:
    seen: list[str | None] = []
    with CookielessClient(transport=recording(seen)) as client:
        client.get("http://llm.test/a")
        client.post("http://llm.test/b", json={})
        assert dict(client.cookies) == {}
        client.cookies.set("sid", "x")
        client.get("http://llm.test/c")
    assert seen == [None, None, None]


def test_the_async_cookieless_client_neither_keeps_nor_sends_a_cookie() -> None:
    seen: list[str | None] = []

    async def run() -> None:
        transport = recording(seen)
        async with CookielessAsyncClient(transport=transport) as client:
            await client.get("http://llm.test/a")
            await client.get("http://llm.test/b")
            assert dict(client.cookies) == {}

    asyncio.run(run())
    assert seen == [None, None]


@pytest.mark.parametrize("kind", [CookielessClient, CookielessAsyncClient])
def test_a_cookieless_client_refuses_cookies_given_to_it(kind: type) -> None:
    with pytest.raises(ValueError, match="no cookies"):
        kind(cookies={"sid": "x"})


def test_the_pipelines_memory_client_sends_no_cookie_one_answer_set() -> None:
    seen: list[str | None] = []
    memory = MemoryClient("http://memory.test", "ibex_token", transport=recording(seen))
    with contextlib.closing(memory):
        for org in (uuid.uuid4(), uuid.uuid4()):
            assert memory.create_memory(org, {"content": "x"}, str(uuid.uuid4())).status == 201
    assert seen == [None, None]
