"""The OpenAI-compatible provider over httpx.MockTransport, the rules provider, make_provider."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import httpx
import pytest

from core.config import Settings
from core.errors import ConfigError, LLMRejectedError, LLMUnavailableError
from extraction.providers import (
    OpenAICompatibleProvider,
    Provider,
    RulesProvider,
    make_provider,
)
from extraction.result import ExtractedMemory
from tests.unit.extraction.helpers import make_turn

API_KEY = "sk-test-0123456789abcdef"
BASE_URL = "https://llm.example.test/v1"
TURN = make_turn("Hi, I'm Dana and I'm allergic to peanuts.", turn_index=2)
CONTEXT = [make_turn("Hello there.", turn_index=1)]

Handler = Callable[[httpx.Request], httpx.Response]


def completion(content: str | None, usage: object = None, **extra: object) -> dict[str, object]:
    body: dict[str, object] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        **extra,
    }
    if usage is not None:
        body["usage"] = usage
    return body


MEMORIES = {"memories": [{"content": "The user's name is Dana.", "kind": "fact"}]}


@pytest.fixture
def requests() -> list[httpx.Request]:
    return []


@pytest.fixture
def provider_for(
    requests: list[httpx.Request],
) -> Iterator[Callable[..., OpenAICompatibleProvider]]:
    clients: list[httpx.Client] = []

    def build(handler: Handler, api_key: str | None = API_KEY) -> OpenAICompatibleProvider:
        def record(request: httpx.Request) -> httpx.Response:
            requests.append(request)
            return handler(request)

        client = httpx.Client(transport=httpx.MockTransport(record))
        clients.append(client)
        return OpenAICompatibleProvider(BASE_URL, "gpt-4o-mini", api_key, timeout=7, client=client)

    yield build
    for client in clients:
        client.close()


def answer(body: object, status: int = 200) -> Handler:
    return lambda request: httpx.Response(status, json=body)


def test_success_sends_the_contract_request_and_returns_memories(
    provider_for: Callable[..., OpenAICompatibleProvider], requests: list[httpx.Request]
) -> None:
    provider = provider_for(answer(completion(json.dumps(MEMORIES))))
    result = provider.extract(TURN, CONTEXT)

    assert result.memories == (ExtractedMemory("The user's name is Dana.", "fact"),)
    assert result.provider == "openai"
    assert result.model == "gpt-4o-mini-2024-07-18"
    (request,) = requests
    assert request.method == "POST"
    assert str(request.url) == f"{BASE_URL}/chat/completions"
    assert request.headers["Authorization"] == f"Bearer {API_KEY}"
    body = json.loads(request.content)
    assert body["model"] == "gpt-4o-mini"
    assert body["response_format"] == {"type": "json_object"}
    assert body["temperature"] == 0
    assert body["messages"][0]["role"] == "system"
    assert "Hi, I'm Dana and I'm allergic to peanuts." in body["messages"][-1]["content"]
    assert "Hello there." in body["messages"][1]["content"]


def test_no_authorization_header_without_a_key(
    provider_for: Callable[..., OpenAICompatibleProvider], requests: list[httpx.Request]
) -> None:
    provider = provider_for(answer(completion('{"memories": []}')), api_key=None)
    assert provider.extract(TURN, []).memories == ()
    assert "Authorization" not in requests[0].headers


def test_code_fenced_content_is_accepted(
    provider_for: Callable[..., OpenAICompatibleProvider],
) -> None:
    fenced = "```json\n" + json.dumps(MEMORIES, indent=2) + "\n```"
    result = provider_for(answer(completion(fenced))).extract(TURN, [])
    assert [m.content for m in result.memories] == ["The user's name is Dana."]


def test_token_usage_is_recorded(provider_for: Callable[..., OpenAICompatibleProvider]) -> None:
    usage = {"prompt_tokens": 321, "completion_tokens": 17, "total_tokens": 338}
    result = provider_for(answer(completion(json.dumps(MEMORIES), usage))).extract(TURN, [])
    assert (result.prompt_tokens, result.completion_tokens) == (321, 17)


@pytest.mark.parametrize("usage", [None, {}, {"prompt_tokens": "many"}, "n/a"])
def test_missing_or_odd_usage_counts_zero(
    provider_for: Callable[..., OpenAICompatibleProvider], usage: object
) -> None:
    result = provider_for(answer(completion(json.dumps(MEMORIES), usage))).extract(TURN, [])
    assert (result.prompt_tokens, result.completion_tokens) == (0, 0)
    assert len(result.memories) == 1


def test_empty_memories_is_a_valid_empty_result(
    provider_for: Callable[..., OpenAICompatibleProvider],
) -> None:
    result = provider_for(answer(completion('{"memories": []}', {"prompt_tokens": 9})))
    extracted = result.extract(TURN, [])
    assert extracted.memories == ()
    assert extracted.prompt_tokens == 9


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504, 408])
def test_rate_limits_and_server_errors_are_transient(
    provider_for: Callable[..., OpenAICompatibleProvider], status: int
) -> None:
    provider = provider_for(answer({"error": {"message": "busy"}}, status))
    with pytest.raises(LLMUnavailableError) as caught:
        provider.extract(TURN, [])
    assert caught.value.status == status
    assert str(status) in str(caught.value)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422])
def test_client_errors_are_permanent(
    provider_for: Callable[..., OpenAICompatibleProvider], status: int
) -> None:
    provider = provider_for(answer({"error": {"message": "model not found"}}, status))
    with pytest.raises(LLMRejectedError) as caught:
        provider.extract(TURN, [])
    assert caught.value.status == status
    assert "model not found" in str(caught.value)


@pytest.mark.parametrize(
    "exc",
    [
        httpx.ReadTimeout("read timed out"),
        httpx.ConnectTimeout("connect timed out"),
        httpx.PoolTimeout("pool timed out"),
        httpx.ConnectError("connection refused"),
        httpx.ReadError("connection reset"),
        httpx.RemoteProtocolError("server disconnected"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_timeouts_and_connection_errors_are_transient(
    provider_for: Callable[..., OpenAICompatibleProvider], exc: httpx.HTTPError
) -> None:
    def fail(request: httpx.Request) -> httpx.Response:
        raise exc

    with pytest.raises(LLMUnavailableError) as caught:
        provider_for(fail).extract(TURN, [])
    assert caught.value.status is None
    assert caught.value.__cause__ is exc


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(200, text="<html>gateway</html>"),
        httpx.Response(200, json=[1, 2]),
        httpx.Response(200, json={"object": "chat.completion"}),
        httpx.Response(200, json={"choices": []}),
        httpx.Response(200, json={"choices": ["x"]}),
        httpx.Response(200, json=completion(None)),
        httpx.Response(200, json=completion("   ")),
        httpx.Response(200, json=completion("Sure! Dana is allergic to peanuts.")),
        httpx.Response(200, json=completion('{"memories": "none"}')),
        httpx.Response(200, json=completion('[{"content": "x"}]')),
    ],
    ids=[
        "html",
        "array",
        "no-choices",
        "empty-choices",
        "bad-choice",
        "null-content",
        "blank-content",
        "prose",
        "bad-shape",
        "bare-list",
    ],
)
def test_unusable_answers_are_transient_never_no_memories(
    provider_for: Callable[..., OpenAICompatibleProvider], response: httpx.Response
) -> None:
    with pytest.raises(LLMUnavailableError):
        provider_for(lambda request: response).extract(TURN, [])


def _echo_key(request: httpx.Request) -> httpx.Response:
    # Some servers echo the key they refused; it must not reach an exception message.
    key = request.headers.get("Authorization", "")
    return httpx.Response(401, json={"error": {"message": f"Incorrect API key: {key}"}})


@pytest.mark.parametrize(
    "handler",
    [
        _echo_key,
        lambda request: httpx.Response(500, text=f"boom {request.headers['Authorization']}"),
        lambda request: httpx.Response(200, json=completion(f"not json {API_KEY}")),
    ],
    ids=["401-echo", "500-echo", "garbage-echo"],
)
def test_api_key_never_appears_in_error_messages(
    provider_for: Callable[..., OpenAICompatibleProvider], handler: Handler
) -> None:
    provider = provider_for(handler)
    with pytest.raises((LLMRejectedError, LLMUnavailableError)) as caught:
        provider.extract(TURN, [])
    assert API_KEY not in str(caught.value)
    assert API_KEY not in repr(caught.value)
    assert API_KEY not in repr(provider)


def test_api_key_not_in_transport_error_message(
    provider_for: Callable[..., OpenAICompatibleProvider],
) -> None:
    def fail(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"refused while sending {request.headers['Authorization']}")

    with pytest.raises(LLMUnavailableError) as caught:
        provider_for(fail).extract(TURN, [])
    assert API_KEY not in str(caught.value)
    assert "***" in str(caught.value)


def test_url_credentials_are_redacted_in_errors() -> None:
    def fail(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503)

    with httpx.Client(transport=httpx.MockTransport(fail)) as client:
        provider = OpenAICompatibleProvider(
            "https://user:hunter2@llm.example.test/v1", "m", timeout=1, client=client
        )
        with pytest.raises(LLMUnavailableError) as caught:
            provider.extract(TURN, [])
    assert "hunter2" not in str(caught.value)


def test_unsupported_url_scheme_is_permanent() -> None:
    provider = OpenAICompatibleProvider("ftp://llm.example.test/v1", "m", timeout=1)
    try:
        with pytest.raises(LLMRejectedError):
            provider.extract(TURN, [])
    finally:
        provider.close()


def test_request_timeout_is_passed_to_every_request(
    provider_for: Callable[..., OpenAICompatibleProvider], requests: list[httpx.Request]
) -> None:
    provider_for(answer(completion('{"memories": []}'))).extract(TURN, [])
    assert requests[0].extensions["timeout"] == {"connect": 7, "read": 7, "write": 7, "pool": 7}


def test_rules_provider_is_deterministic_and_offline() -> None:
    provider: Provider = RulesProvider()
    first = provider.extract(TURN, CONTEXT)
    assert first == provider.extract(TURN, CONTEXT)
    assert first.provider == "rules"
    assert first.model == provider.model
    assert [m.content for m in first.memories] == [
        "The user's name is Dana.",
        "The user is allergic to peanuts.",
    ]
    assert (first.prompt_tokens, first.completion_tokens) == (0, 0)


def test_make_provider_picks_rules_without_a_base_url() -> None:
    provider = make_provider(Settings.from_env({}))
    assert isinstance(provider, RulesProvider)
    assert provider.name == "rules"


def test_make_provider_builds_the_openai_provider_from_settings() -> None:
    settings = Settings.from_env(
        {
            "LLM_BASE_URL": "http://127.0.0.1:9/v1/",
            "LLM_MODEL": "llama3",
            "LLM_API_KEY": API_KEY,
            "LLM_TIMEOUT_SECONDS": "12",
        }
    )
    with httpx.Client() as client:
        provider = make_provider(settings, client=client)
        assert isinstance(provider, OpenAICompatibleProvider)
        assert provider.name == "openai"
        assert provider.model == "llama3"
        assert provider.url == "http://127.0.0.1:9/v1/chat/completions"
        assert provider.timeout == 12
        assert API_KEY not in repr(provider)


def test_make_provider_rejects_an_unknown_provider() -> None:
    settings = Settings.from_env({})
    broken = Settings(**{**settings.__dict__, "llm_provider": "magic"})
    with pytest.raises(ConfigError):
        make_provider(broken)


def test_a_base_url_httpx_cannot_parse_is_refused_at_start() -> None:
    with pytest.raises(ConfigError) as caught:
        OpenAICompatibleProvider("http://llm.test:port/v1", "m", "k", timeout=1.0)
    assert caught.value.variable == "LLM_BASE_URL"
