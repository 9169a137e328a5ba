"""OpenAICompatibleProvider against the fake LLM server over real loopback HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from bench.fake_llm import FakeLLM
from core.errors import LLMRejectedError, LLMUnavailableError
from extraction.prompt import build_messages
from extraction.providers import OpenAICompatibleProvider
from tests.unit.extraction.helpers import make_turn

TURN = make_turn("I'm Dana and I love tea.", turn_index=2)
OTHER = make_turn("I live in Oslo.", turn_index=3)


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM(latency_ms=0, memories=3) as server:
        yield server


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client() as c:
        yield c


@pytest.fixture
def provider(llm: FakeLLM, client: httpx.Client) -> OpenAICompatibleProvider:
    return OpenAICompatibleProvider(llm.base_url, "fake-model", "sk-x", timeout=5, client=client)


def test_answers_memories_derived_from_the_last_user_message(
    llm: FakeLLM, provider: OpenAICompatibleProvider
) -> None:
    assert llm.base_url.startswith("http://127.0.0.1:")
    result = provider.extract(TURN, [make_turn("earlier", turn_index=1)])
    assert [m.content for m in result.memories] == [
        f"Fact {i} about: I'm Dana and I love tea." for i in (1, 2, 3)
    ]
    assert [m.kind for m in result.memories] == ["fact", "preference", "event"]
    assert result.prompt_tokens > 0 and result.completion_tokens > 0
    assert result.model == "fake-model"
    assert provider.extract(TURN, []).memories == result.memories  # no reword: stable


def test_calls_are_counted_per_turn_and_reset(
    llm: FakeLLM, provider: OpenAICompatibleProvider, client: httpx.Client
) -> None:
    provider.extract(TURN, [])
    provider.extract(TURN, [])
    provider.extract(OTHER, [])
    assert llm.calls_for(build_messages(TURN, [])) == 2
    assert llm.calls_for(build_messages(OTHER, [])) == 1
    stats = client.get(llm.base_url.removesuffix("/v1") + "/stats").json()
    assert stats["calls"] == 3
    assert stats["turns"] == 2
    assert stats["max_calls_per_turn"] == 2
    assert sorted(stats["calls_per_turn"].values()) == [1, 2]
    client.post(llm.base_url.removesuffix("/v1") + "/reset")
    assert llm.stats()["calls"] == 0


def test_reword_words_every_call_differently(
    llm: FakeLLM, provider: OpenAICompatibleProvider
) -> None:
    llm.reword = True
    first = provider.extract(TURN, [])
    second = provider.extract(TURN, [])
    assert len(first.memories) == len(second.memories) == 3
    assert {m.content for m in first.memories}.isdisjoint(m.content for m in second.memories)


def test_count_varies_changes_the_number_of_memories(
    llm: FakeLLM, provider: OpenAICompatibleProvider
) -> None:
    llm.count_varies = True
    counts = [len(provider.extract(TURN, []).memories) for _ in range(3)]
    assert counts == [2, 3, 4]


@pytest.mark.parametrize("status", [429, 500])
def test_fail_next_is_transient_then_recovers(
    llm: FakeLLM, provider: OpenAICompatibleProvider, status: int
) -> None:
    llm.fail_next(2, status)
    for _ in range(2):
        with pytest.raises(LLMUnavailableError) as caught:
            provider.extract(TURN, [])
        assert caught.value.status == status
    assert len(provider.extract(TURN, []).memories) == 3
    assert llm.stats()["failures"] == 2
    assert llm.stats()["answered"] == 1


def test_fail_rate_is_seeded_and_roughly_right(
    llm: FakeLLM, provider: OpenAICompatibleProvider
) -> None:
    llm.fail_rate = 0.5
    outcomes = []
    for _ in range(40):
        try:
            provider.extract(TURN, [])
            outcomes.append(True)
        except LLMUnavailableError:
            outcomes.append(False)
    assert 5 < outcomes.count(False) < 35
    assert llm.stats()["failures"] == outcomes.count(False)


def test_garbage_is_transient(llm: FakeLLM, provider: OpenAICompatibleProvider) -> None:
    llm.garbage_next(1)
    with pytest.raises(LLMUnavailableError, match="unparseable"):
        provider.extract(TURN, [])
    assert len(provider.extract(TURN, []).memories) == 3
    llm.garbage_rate = 1.0
    with pytest.raises(LLMUnavailableError):
        provider.extract(TURN, [])


def test_fenced_answers_and_zero_memories(llm: FakeLLM, provider: OpenAICompatibleProvider) -> None:
    llm.configure(fence=True, memories=0)
    assert provider.extract(TURN, []).memories == ()


def test_wrong_api_key_is_permanent(client: httpx.Client) -> None:
    with FakeLLM(api_key="sk-right") as llm:
        wrong = OpenAICompatibleProvider(llm.base_url, "m", "sk-wrong", timeout=5, client=client)
        with pytest.raises(LLMRejectedError) as caught:
            wrong.extract(TURN, [])
        assert caught.value.status == 401
        assert "sk-wrong" not in str(caught.value)
        right = OpenAICompatibleProvider(llm.base_url, "m", "sk-right", timeout=5, client=client)
        assert len(right.extract(TURN, []).memories) == 3


def test_unknown_path_is_permanent(llm: FakeLLM, client: httpx.Client) -> None:
    provider = OpenAICompatibleProvider(llm.base_url + "/nowhere", "m", timeout=5, client=client)
    with pytest.raises(LLMRejectedError) as caught:
        provider.extract(TURN, [])
    assert caught.value.status == 404


def test_slow_answer_times_out_as_transient(llm: FakeLLM, client: httpx.Client) -> None:
    llm.latency_ms = 500
    provider = OpenAICompatibleProvider(llm.base_url, "m", timeout=0.1, client=client)
    with pytest.raises(LLMUnavailableError, match="timed out"):
        provider.extract(TURN, [])


def test_connection_refused_is_transient(client: httpx.Client) -> None:
    with FakeLLM() as llm:
        base_url = llm.base_url
    provider = OpenAICompatibleProvider(base_url, "m", timeout=2, client=client)
    with pytest.raises(LLMUnavailableError):
        provider.extract(TURN, [])


def test_control_endpoint_sets_knobs(llm: FakeLLM, client: httpx.Client) -> None:
    root = llm.base_url.removesuffix("/v1")
    knobs = client.post(f"{root}/control", json={"memories": 1, "fail_next": 1}).json()
    assert knobs["memories"] == 1
    assert client.post(f"{root}/control", json={"nope": 1}).status_code == 400
    provider = OpenAICompatibleProvider(llm.base_url, "m", timeout=5, client=client)
    with pytest.raises(LLMUnavailableError):
        provider.extract(TURN, [])
    assert len(provider.extract(TURN, []).memories) == 1


def test_plain_openai_clients_without_our_prompt_work(llm: FakeLLM, client: httpx.Client) -> None:
    response = client.post(
        llm.base_url.removesuffix("/v1") + "/chat/completions",
        json={"model": "x", "messages": [{"role": "user", "content": "I like jazz"}]},
    )
    content = json.loads(response.json()["choices"][0]["message"]["content"])
    assert content["memories"][0]["content"] == "Fact 1 about: I like jazz"


def test_cli_serves_until_terminated(client: httpx.Client) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.fake_llm", "--port", "0", "--memories", "2", "--reword"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        base_url = line.strip().rsplit("LLM_BASE_URL=", 1)[1]
        provider = OpenAICompatibleProvider(base_url, "m", timeout=5, client=client)
        assert len(provider.extract(TURN, []).memories) == 2
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert json.loads(err)["calls"] == 1
