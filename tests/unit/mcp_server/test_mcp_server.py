"""The MCP server's own decisions, without a service: the idempotency key of ``remember``, the
bearer token, the configuration from the environment, the tool schemas the SDK publishes and
how an API refusal reads."""

from __future__ import annotations

import asyncio
import uuid

import httpx

from ibex_client import AsyncIbexClient
from mcp_server import TOOL_NAMES, McpConfig, build_server, remember_key
from mcp_server.calls import bearer as _bearer
from mcp_server.calls import shared_pool

AGENT = uuid.UUID("0b0c4a4e-3c55-4c79-9d2f-4f1f0bb3f7a1")


def test_remember_key_is_the_same_for_the_same_call_and_scope() -> None:
    key = remember_key("tok", AGENT, None, "Dana is allergic to peanuts.", "fact")
    assert key == remember_key("tok", AGENT, None, "Dana is allergic to peanuts.", "fact")
    assert key.startswith("mcp-remember-") and len(key) <= 255
    assert "tok" not in key.removeprefix("mcp-remember-")
    others = {
        remember_key("tok2", AGENT, None, "Dana is allergic to peanuts.", "fact"),
        remember_key("tok", uuid.uuid4(), None, "Dana is allergic to peanuts.", "fact"),
        remember_key("tok", AGENT, "dana", "Dana is allergic to peanuts.", "fact"),
        remember_key("tok", AGENT, None, "Dana is allergic to pecans.", "fact"),
        remember_key("tok", AGENT, None, "Dana is allergic to peanuts.", "event"),
    }
    assert key not in others and len(others) == 5


def test_bearer_header() -> None:
    assert _bearer("Bearer abc") == "abc"
    assert _bearer("bearer  abc ") == "abc"
    assert _bearer("Basic abc") is None
    assert _bearer("Bearer ") is None
    assert _bearer(None) is None


def test_config_from_the_environment() -> None:
    config = McpConfig.from_env(
        {"IBEX_URL": "http://ibex:8000/", "IBEX_TOKEN": "t", "IBEX_AGENT": "bot"}
    )
    assert config == McpConfig("http://ibex:8000", "t", "bot", None)
    assert McpConfig.from_env({}).url == "http://127.0.0.1:8000"


def test_the_tools_and_their_schemas() -> None:
    tools = {t.name: t for t in asyncio.run(build_server(McpConfig("http://x")).list_tools())}
    assert set(tools) == set(TOOL_NAMES)
    required = {name: tools[name].input_schema.get("required", []) for name in TOOL_NAMES}
    assert required == {
        "remember": ["content"],
        "recall": ["query"],
        "context": ["query"],
        "forget": ["memory_id"],
        "list_memories": [],
    }
    props = {name: tools[name].input_schema["properties"] for name in TOOL_NAMES}
    assert props["remember"]["kind"]["default"] == "fact"
    assert props["recall"]["limit"]["default"] == 10
    assert props["context"]["max_tokens"]["default"] == 400
    assert props["list_memories"]["cursor"]["default"] is None
    for name in ("remember", "recall", "context", "list_memories"):
        assert {"agent", "user"} <= set(props[name]), name
    for tool in tools.values():
        assert tool.description and tool.output_schema, tool.name
    hints = {name: tools[name].annotations for name in TOOL_NAMES}
    assert all(hints[n].read_only_hint for n in ("recall", "context", "list_memories"))
    assert hints["remember"].idempotent_hint and not hints["remember"].destructive_hint
    assert hints["forget"].destructive_hint


def test_an_api_refusal_names_its_code_and_fields() -> None:
    from ibex_client.errors import error_for
    from mcp_server.answers import api_error as _api_error

    scope = error_for(403, "INSUFFICIENT_SCOPE", "this token lacks the memory:write scope")
    assert str(_api_error(scope)) == ("INSUFFICIENT_SCOPE: this token lacks the memory:write scope")
    invalid = error_for(
        422,
        "VALIDATION_FAILED",
        "the body is invalid",
        {"fields": {"content": ["must not be blank"], "kind": ["unknown kind"]}},
    )
    assert str(_api_error(invalid)) == (
        "VALIDATION_FAILED: the body is invalid (content: must not be blank; kind: unknown kind)"
    )
    assert str(_api_error(error_for(502, None, None))).startswith("502: ")


def test_the_shared_pool_keeps_no_cookie_from_one_caller_for_another() -> None:
    """One pool serves every token: a cookie the answer to token A set (a proxy in front of
    the service) is neither kept nor sent with token B's call, nor with A's next one."""
    seen: list[tuple[str | None, str | None]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append((request.headers.get("authorization"), request.headers.get("cookie")))
        body = {
            "id": str(AGENT),
            "slug": "bot",
            "name": "Bot",
            "created_at": "2026-01-01T00:00:00Z",
        }
        return httpx.Response(200, json=body, headers={"Set-Cookie": "session=of-a; Path=/"})

    async def calls() -> httpx.Cookies:
        http = shared_pool(5.0, transport=httpx.MockTransport(answer))
        try:
            for token in ("token-a", "token-b", "token-a"):
                await AsyncIbexClient("http://ibex", token, client=http).get_agent("bot")
            return http.cookies
        finally:
            await http.aclose()

    jar = asyncio.run(calls())
    assert [cookie for _, cookie in seen] == [None, None, None]
    assert [auth for auth, _ in seen] == ["Bearer token-a", "Bearer token-b", "Bearer token-a"]
    assert len(jar) == 0
