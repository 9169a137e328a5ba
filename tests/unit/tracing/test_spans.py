"""The spans of the LLM call, the memory POST, the web request and the chat call: their
conventions, the context they pass on, and that no span holds a word of the conversation or
of a memory, not even when the call fails with a message that quotes it."""

from __future__ import annotations

import contextlib
import json
import uuid
from typing import Any

import falcon
import falcon.testing
import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from core import tracing
from core.errors import LLMUnavailableError, MemoryRejectedError
from extraction.memory_client import MemoryClient
from extraction.providers import OpenAICompatibleProvider
from memory_service.tracing import TraceRequests as WebTraceRequests
from proxy.tracing import TraceRequests as ProxyTraceRequests
from tests.unit.extraction.helpers import make_turn
from tests.unit.tracing.helpers import every_text, recorded_spans

#: The distinctive word of the conversation and of the memory: no span may carry it.
WORD = "Quetzalcoatlus"
ORG = uuid.uuid4()
TURN = make_turn(f"My parrot is called {WORD}.", turn_index=2, completion=f"{WORD}, lovely!")


@pytest.fixture
def spans() -> Any:
    with recorded_spans() as exporter:
        yield exporter


def _no_word(exporter: Any) -> list[Any]:
    found = exporter.get_finished_spans()
    assert found
    for span in found:
        for text in every_text(span):
            assert WORD not in text, (span.name, text)
    return list(found)


def _completion(content: str) -> dict[str, Any]:
    return {
        "model": "gpt-test-2025",
        "choices": [{"message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 321, "completion_tokens": 45},
    }


def _provider(handler: Any) -> OpenAICompatibleProvider:
    return OpenAICompatibleProvider(
        "https://llm.example.test/v1",
        "gpt-test",
        timeout=5,
        client=httpx.Client(transport=httpx.MockTransport(handler)),
    )


def test_the_llm_call_is_a_genai_chat_span_with_usage_and_no_text(spans: Any) -> None:
    answer = {"memories": [{"content": f"The user's parrot is {WORD}.", "kind": "fact"}]}
    provider = _provider(lambda r: httpx.Response(200, json=_completion(json.dumps(answer))))
    with tracing.span("extract_turn process", kind="consumer") as parent:
        result = provider.extract(TURN, [])
    assert WORD in result.memories[0].content
    [llm] = [s for s in _no_word(spans) if s.name == "chat gpt-test"]
    assert llm.kind.name == "CLIENT"
    assert llm.parent.span_id == parent.get_span_context().span_id
    assert llm.attributes["gen_ai.operation.name"] == "chat"
    assert llm.attributes["gen_ai.provider.name"] == "openai"
    assert llm.attributes["gen_ai.system"] == "openai"
    assert llm.attributes["gen_ai.request.model"] == "gpt-test"
    assert llm.attributes["gen_ai.response.model"] == "gpt-test-2025"
    assert llm.attributes["gen_ai.usage.input_tokens"] == 321
    assert llm.attributes["gen_ai.usage.output_tokens"] == 45
    assert llm.attributes["server.address"] == "llm.example.test"


def test_a_failed_llm_call_says_its_class_never_the_body_it_quotes(spans: Any) -> None:
    provider = _provider(lambda r: httpx.Response(503, text=f"overloaded while reading {WORD}"))
    with pytest.raises(LLMUnavailableError) as raised:
        provider.extract(TURN, [])
    assert WORD in str(raised.value)  # the exception quotes it; the span must not
    [llm] = _no_word(spans)
    assert llm.status.status_code.name == "ERROR"
    assert llm.attributes["error.type"] == "LLMUnavailableError"


def _memory_client(seen: list[httpx.Request], answer: httpx.Response) -> MemoryClient:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answer

    return MemoryClient("http://memory.test:8000", "tok", transport=httpx.MockTransport(handler))


def test_the_memory_post_is_a_client_span_whose_context_goes_in_the_headers(spans: Any) -> None:
    seen: list[httpx.Request] = []
    body = {"agent_id": str(uuid.uuid4()), "content": f"Parrot: {WORD}", "kind": "fact"}
    client = _memory_client(seen, httpx.Response(201, json={"id": str(uuid.uuid4())}))
    with contextlib.closing(client):
        client.create_memory(ORG, body, "key-1")
    [post] = _no_word(spans)
    assert (post.name, post.kind.name) == ("POST /v1/memories", "CLIENT")
    assert post.attributes["http.response.status_code"] == 201
    assert post.attributes["ibex.org_id"] == str(ORG)
    context = post.get_span_context()
    sent = seen[0].headers["traceparent"]
    assert sent.startswith(f"00-{context.trace_id:032x}-{context.span_id:016x}-")


def test_a_refused_memory_post_records_the_status_not_the_message(spans: Any) -> None:
    seen: list[httpx.Request] = []
    refusal = {"error": {"code": "VALIDATION_ERROR", "message": f"{WORD} is too long"}}
    client = _memory_client(seen, httpx.Response(422, json=refusal))
    with contextlib.closing(client), pytest.raises(MemoryRejectedError):
        client.create_memory(ORG, {"content": WORD}, "key-2")
    [post] = _no_word(spans)
    assert post.attributes["http.response.status_code"] == 422
    assert post.attributes["error.type"] == "MemoryRejectedError"


class Thing:
    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        if name == "boom":
            raise falcon.HTTPInternalServerError()
        resp.media = {"name": name}


def test_the_web_request_joins_the_callers_trace_by_route_template(spans: Any) -> None:
    app = falcon.App(middleware=[WebTraceRequests()])
    app.add_route("/v1/things/{name}", Thing())
    client = falcon.testing.TestClient(app)
    with tracing.span("caller", kind="client") as caller:
        headers = tracing.inject({})
    assert client.simulate_get(f"/v1/things/{WORD}", headers=headers).status_code == 200
    assert client.simulate_get("/v1/things/boom").status_code == 500
    ok, boom = [s for s in _no_word(spans) if s.kind.name == "SERVER"]
    assert ok.name == "GET /v1/things/{name}"
    assert ok.parent.span_id == caller.get_span_context().span_id
    assert ok.context.trace_id == caller.get_span_context().trace_id
    assert ok.attributes["http.route"] == "/v1/things/{name}"
    assert ok.attributes["http.request.method"] == "GET"
    assert ok.attributes["http.response.status_code"] == 200
    assert boom.parent is None and boom.status.status_code.name == "ERROR"
    assert boom.attributes["http.response.status_code"] == 500


def test_the_chat_call_span_holds_the_spool_message_context(spans: Any) -> None:
    spooled: list[dict[str, Any]] = []

    async def chat(request: Request) -> JSONResponse:
        spooled.append(tracing.inject({}))  # what proxy.spool puts in the message's options
        return JSONResponse({"ok": True})

    app = Starlette(
        routes=[Route("/v1/chat/completions", chat, methods=["POST"])],
        middleware=[Middleware(ProxyTraceRequests)],
    )
    with tracing.span("application", kind="client") as caller:
        headers = tracing.inject({})
    with TestClient(app) as client:
        assert client.post("/v1/chat/completions", json={"m": WORD}, headers=headers).is_success
        assert client.post(f"/{WORD}", json={}).status_code == 404
    chat_span, unknown = [s for s in _no_word(spans) if s.kind.name == "SERVER"]
    assert chat_span.name == "POST /v1/chat/completions"
    assert chat_span.parent.span_id == caller.get_span_context().span_id
    assert chat_span.attributes["http.response.status_code"] == 200
    assert spooled[0]["traceparent"].split("-")[2] == f"{chat_span.context.span_id:016x}"
    assert unknown.name == "POST" and "http.route" not in unknown.attributes


def test_the_spooled_turn_carries_the_current_context(spans: Any) -> None:
    from dramatiq.brokers.stub import StubBroker

    from proxy.spool import DramatiqSpool
    from sessions.chat import SPOOL_QUEUE

    spool = DramatiqSpool.__new__(DramatiqSpool)  # its broker, without a Redis to connect to
    spool.broker = StubBroker(middleware=[])
    spool.broker.declare_queue(SPOOL_QUEUE)
    with tracing.span("POST /v1/chat/completions", kind="server") as request:
        spool.put({"external_id": "conv-1", "messages": [{"role": "user", "content": WORD}]})
    message = json.loads(spool.broker.queues[SPOOL_QUEUE].get_nowait())
    context = request.get_span_context()
    assert message["options"]["traceparent"].startswith(
        f"00-{context.trace_id:032x}-{context.span_id:016x}-"
    )
    assert WORD not in json.dumps(message["options"])
