"""A fake OpenAI-compatible chat completions server for tests and benchmarks.

It answers ``POST /v1/chat/completions`` (and ``/chat/completions``) in the OpenAI response
shape, with ``choices[0].message.content`` a JSON string ``{"memories": [...]}`` derived
deterministically from the last user message of the turn being extracted, and ``usage``.
Knobs, all settable at runtime (attributes, or ``POST /control`` with a JSON object):

- ``latency_ms`` / ``jitter_ms``: time to answer (jitter is uniform in ±jitter_ms, seeded);
- ``memories``: memories per answer;
- ``reword``: every call words the memories differently (the "first result wins" test);
- ``count_varies``: the number of memories changes from one call to the next;
- ``fail_rate`` / ``fail_status``: answer ``fail_status`` (429 or 500) at that rate;
  :meth:`FakeLLM.fail_next` fails the next N calls;
- ``garbage_rate``: answer non-JSON content at that rate; :meth:`FakeLLM.garbage_next`;
- ``fence``: wrap the content in a Markdown code fence;
- ``replaces``: ``"first"``: the first memory of an answer replaces the first related memory
  the request lists (``m1``, see ``extraction.prompt``), when it lists one; any other
  non-empty value is answered as that ref, listed or not (an unknown ref); ``""`` (the
  default): no ``replaces``;
- ``api_key``: when set, requests without ``Authorization: Bearer <api_key>`` get 401;
- ``"stream": true`` requests are answered as server-sent events, the content in
  ``stream_chunks`` pieces ``stream_chunk_ms`` apart, a ``usage`` chunk when the request asks
  for it (``stream_options.include_usage``), then ``data: [DONE]``; ``cut_stream_after``
  (chunks) breaks the connection off mid-stream instead, as a failing upstream does;
- ``reply``: answer this text instead of the memories JSON (a chat model's reply).

Every chat request body is kept in :attr:`FakeLLM.bodies` (the last 100), so a test can see
what reached the upstream.

Calls are counted per turn, keyed by a hash of the request's last message (the turn to extract
from): ``GET /stats`` returns them as JSON, :meth:`FakeLLM.stats` and :attr:`FakeLLM.calls`
too; ``POST /reset`` or :meth:`FakeLLM.reset` clears them.

In-process::

    with FakeLLM(latency_ms=0, memories=3) as llm:
        provider = OpenAICompatibleProvider(llm.base_url, "fake", timeout=5)

From a shell::

    python -m bench.fake_llm --port 8089 --latency-ms 200 --memories 3 --reword
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import signal
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType, TracebackType
from typing import Any

CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")
KINDS = ("fact", "preference", "event")
SNIPPET_CHARS = 80
MAX_BODY_BYTES = 10 * 1024 * 1024


def turn_key(messages: list[Any]) -> str:
    """The per-turn counter key: a short hash of the request's last message."""
    last = messages[-1] if messages else {}
    content = last.get("content") if isinstance(last, dict) else last
    text = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and "text" in p)
    return ""


def last_user_text(messages: list[Any]) -> str:
    """The last user message of the turn to extract from.

    The request's last message holds the turn as a JSON document (see
    ``extraction.prompt``); its last ``user`` message is used. For any other client the last
    message's text itself is used.
    """
    last = messages[-1] if messages else {}
    text = _text(last.get("content")) if isinstance(last, dict) else ""
    start = text.find("{")
    if start >= 0:
        try:
            turn = json.loads(text[start:])
        except ValueError:
            turn = None
        if isinstance(turn, dict) and isinstance(turn.get("messages"), list):
            users = [
                _text(m.get("content"))
                for m in turn["messages"]
                if isinstance(m, dict) and m.get("role") == "user"
            ]
            if users:
                return users[-1]
    return text


#: A related memory's line in the request (``extraction.prompt``): ``m3: <content> (<kind>)``.
_RELATED_LINE = re.compile(r"^(m\d+): ", re.M)


def related_refs(messages: list[Any]) -> list[str]:
    """The refs of the related memories the request lists, in order (none: not listed)."""
    for message in messages[:-1]:
        text = _text(message.get("content")) if isinstance(message, dict) else ""
        if text.startswith("MEMORIES ALREADY STORED"):
            return _RELATED_LINE.findall(text)
    return []


class FakeLLM:
    """The server, its knobs and its counters. Thread-safe; a context manager."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        latency_ms: float = 0,
        jitter_ms: float = 0,
        memories: int = 3,
        reword: bool = False,
        count_varies: bool = False,
        fail_rate: float = 0.0,
        fail_status: int = 500,
        garbage_rate: float = 0.0,
        fence: bool = False,
        replaces: str = "",
        api_key: str | None = None,
        model: str = "fake-llm",
        seed: int = 0,
        stream_chunks: int = 4,
        stream_chunk_ms: float = 0,
        cut_stream_after: int = 0,
        reply: str | None = None,
        set_cookie: str | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.latency_ms = latency_ms
        self.jitter_ms = jitter_ms
        self.memories = memories
        self.reword = reword
        self.count_varies = count_varies
        self.fail_rate = fail_rate
        self.fail_status = fail_status
        self.garbage_rate = garbage_rate
        self.fence = fence
        self.replaces = replaces
        self.api_key = api_key
        self.model = model
        self._seed = seed
        self.stream_chunks = stream_chunks
        self.stream_chunk_ms = stream_chunk_ms
        self.cut_stream_after = cut_stream_after
        self.reply = reply
        #: A ``Set-Cookie`` every answer carries (as the CDNs in front of LLM APIs send);
        #: ``cookies`` holds the ``Cookie`` header of each chat request (None: none sent).
        self.set_cookie = set_cookie
        self.cookies: list[str | None] = []
        self.bodies: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self._fail_next: list[int] = []
        self._garbage_next = 0
        self.calls: Counter[str] = Counter()  # every chat request, per turn key
        self.answered: Counter[str] = Counter()  # valid answers, per turn key
        self.failures = 0
        self.garbage = 0
        self.requests = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifetime ---------------------------------------------------------------------------

    def start(self) -> FakeLLM:
        server = ThreadingHTTPServer((self.host, self.port), _handler_for(self))
        server.daemon_threads = True
        self._server = server
        self.port = server.server_address[1]
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            daemon=True,
            name=f"fake-llm:{self.port}",
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeLLM:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``: what ``LLM_BASE_URL`` should be."""
        return f"http://{self.host}:{self.port}/v1"

    # -- knobs and counters ------------------------------------------------------------------

    def fail_next(self, count: int, status: int = 500) -> None:
        """Answer the next ``count`` chat requests with ``status`` (429, 500, 401, ...)."""
        with self._lock:
            self._fail_next.extend([status] * count)

    def garbage_next(self, count: int) -> None:
        """Answer the next ``count`` chat requests with content that is not JSON."""
        with self._lock:
            self._garbage_next += count

    def reset(self) -> None:
        """Clear the counters and pending failures; the knobs stay as they are."""
        with self._lock:
            self.calls.clear()
            self.answered.clear()
            self.failures = self.garbage = self.requests = 0
            self._fail_next.clear()
            self._garbage_next = 0
            self._random = random.Random(self._seed)

    def configure(self, **knobs: Any) -> None:
        """Set knobs by name (what ``POST /control`` does); ``fail_next`` and
        ``garbage_next`` are accepted as counts."""
        fail_next = knobs.pop("fail_next", None)
        garbage_next = knobs.pop("garbage_next", None)
        for name, value in knobs.items():
            if name not in _KNOBS:
                raise ValueError(f"unknown knob {name!r}")
            setattr(self, name, _KNOBS[name](value))
        if fail_next:
            self.fail_next(int(fail_next), int(knobs.get("fail_status", self.fail_status)))
        if garbage_next:
            self.garbage_next(int(garbage_next))

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": self.requests,
                "calls": sum(self.calls.values()),
                "answered": sum(self.answered.values()),
                "failures": self.failures,
                "garbage": self.garbage,
                "turns": len(self.calls),
                "max_calls_per_turn": max(self.calls.values(), default=0),
                # What is left of a fail_next / garbage_next burst (0: it has all been served).
                "pending_failures": len(self._fail_next),
                "pending_garbage": self._garbage_next,
                "calls_per_turn": dict(self.calls),
                "answered_per_turn": dict(self.answered),
            }

    def calls_for(self, messages: list[Any]) -> int:
        """How many chat requests were made for the turn these request messages extract."""
        with self._lock:
            return self.calls[turn_key(messages)]

    # -- answering ---------------------------------------------------------------------------

    def _delay(self) -> float:
        with self._lock:
            jitter = self._random.uniform(-self.jitter_ms, self.jitter_ms) if self.jitter_ms else 0
        return max(0.0, (self.latency_ms + jitter) / 1000)

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """The status and JSON body for one chat completion request."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return 400, _error("messages must be a non-empty list", "invalid_request_error")
        key = turn_key(messages)
        with self._lock:
            self.bodies.append(body)
            del self.bodies[:-100]
            self.calls[key] += 1
            call_no = self.calls[key]
            status = self._fail_next.pop(0) if self._fail_next else None
            if status is None and self.fail_rate and self._random.random() < self.fail_rate:
                status = self.fail_status
            garbage = False
            if status is None:
                if self._garbage_next:
                    self._garbage_next -= 1
                    garbage = True
                elif self.garbage_rate and self._random.random() < self.garbage_rate:
                    garbage = True
            if status is not None:
                self.failures += 1
            elif garbage:
                self.garbage += 1
            else:
                self.answered[key] += 1
        delay = self._delay()
        if delay:
            time.sleep(delay)
        if status is not None:
            kind = "rate_limit_exceeded" if status == 429 else "server_error"
            return status, _error(f"injected failure {status}", kind)
        if garbage:
            content = f"Sure! Here are the memories you asked for (call {call_no}) -- oops"
        elif self.reply is not None:
            content = self.reply
        else:
            content = json.dumps({"memories": self.memories_for(messages, call_no)})
            if self.fence:
                content = f"```json\n{content}\n```"
        prompt_chars = sum(len(_text(m.get("content"))) for m in messages if isinstance(m, dict))
        prompt_tokens = max(1, prompt_chars // 4)
        completion_tokens = max(1, len(content) // 4)
        return 200, {
            "id": f"chatcmpl-fake-{key}-{call_no}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(body.get("model") or self.model),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    def memories_for(self, messages: list[Any], call_no: int = 1) -> list[dict[str, Any]]:
        """The memories answered on call ``call_no`` for this turn (deterministic)."""
        subject = re.sub(r"\s+", " ", last_user_text(messages)).strip()[:SNIPPET_CHARS]
        subject = subject or "the conversation"
        count = self.memories
        if self.count_varies:
            count = max(0, count + (call_no - 1) % 3 - 1)
        out: list[dict[str, Any]] = []
        for i in range(count):
            content = f"Fact {i + 1} about: {subject}"
            if self.reword:
                content = f"{content} (wording {call_no})"
            out.append({"content": content, "kind": KINDS[i % len(KINDS)]})
        ref = self.replaces
        if ref == "first":
            listed = related_refs(messages)
            ref = listed[0] if listed else ""
        if ref and out:
            out[0]["replaces"] = [ref]
        return out


_KNOBS: dict[str, Any] = {
    "latency_ms": float,
    "jitter_ms": float,
    "memories": int,
    "reword": bool,
    "count_varies": bool,
    "fail_rate": float,
    "fail_status": int,
    "garbage_rate": float,
    "fence": bool,
    "stream_chunks": int,
    "stream_chunk_ms": float,
    "cut_stream_after": int,
    "reply": str,
    "replaces": str,
}


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def stream_events(answer: dict[str, Any], pieces: int, *, include_usage: bool) -> list[bytes]:
    """A chat completion answer as the ``data:`` events of its stream, ``[DONE]`` last."""
    content = answer["choices"][0]["message"]["content"]
    size = max(1, -(-len(content) // max(1, pieces)))
    parts = [content[i : i + size] for i in range(0, len(content), size)] or [""]
    base = {k: answer[k] for k in ("id", "created", "model")}
    base["object"] = "chat.completion.chunk"
    chunks: list[dict[str, Any]] = [
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    ]
    chunks += [
        {**base, "choices": [{"index": 0, "delta": {"content": part}, "finish_reason": None}]}
        for part in parts
    ]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    if include_usage:
        chunks.append({**base, "choices": [], "usage": answer["usage"]})
    events = [b"data: " + json.dumps(c).encode("utf-8") + b"\n\n" for c in chunks]
    return [*events, b"data: [DONE]\n\n"]


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": None}}


def _handler_for(llm: FakeLLM) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, like a real endpoint
        # Headers and body go out as two writes: without this, each answer waits for the
        # client's delayed ACK (about 40 ms).
        disable_nagle_algorithm = True
        server_version = "FakeLLM/1"

        def log_message(self, format: str, *args: Any) -> None:
            return  # quiet: benchmarks make thousands of requests

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status == 429:
                self.send_header("Retry-After", "1")
            if llm.set_cookie:
                self.send_header("Set-Cookie", llm.set_cookie)
            self.end_headers()
            self.wfile.write(data)

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def _stream(self, answer: dict[str, Any], *, include_usage: bool) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            if llm.set_cookie:
                self.send_header("Set-Cookie", llm.set_cookie)
            self.end_headers()
            events = stream_events(answer, llm.stream_chunks, include_usage=include_usage)
            for sent, event in enumerate(events):
                if llm.cut_stream_after and sent >= llm.cut_stream_after:
                    self.close_connection = True
                    self.wfile.flush()
                    # Break the connection off mid-body: no last chunk, no [DONE].
                    self.connection.shutdown(2)
                    return
                if sent and llm.stream_chunk_ms:
                    time.sleep(llm.stream_chunk_ms / 1000)
                self._chunk(event)
            self.wfile.write(b"0\r\n\r\n")  # the last chunk: the body is complete

        def _body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                raise ValueError("body too large")
            raw = self.rfile.read(length) if length else b""
            return json.loads(raw or b"null")

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0].rstrip("/")
            if path == "/stats":
                self._send(200, llm.stats())
            elif path in ("/v1/models", "/models"):
                self._send(200, {"object": "list", "data": [{"id": llm.model, "object": "model"}]})
            elif path in ("/healthz", ""):
                self._send(200, {"ok": True})
            else:
                self._send(404, _error(f"no route {self.path}", "not_found"))

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0].rstrip("/")
            try:
                body = self._body()
            except (ValueError, UnicodeDecodeError):
                self._send(400, _error("body is not JSON", "invalid_request_error"))
                return
            with llm._lock:
                llm.requests += 1
            if path in CHAT_PATHS:
                with llm._lock:
                    llm.cookies.append(self.headers.get("Cookie"))
                if llm.api_key and self.headers.get("Authorization") != f"Bearer {llm.api_key}":
                    self._send(401, _error("invalid api key", "invalid_request_error"))
                    return
                if not isinstance(body, dict):
                    self._send(400, _error("body must be an object", "invalid_request_error"))
                    return
                status, answer = llm.answer(body)
                if body.get("stream") is True and status == 200:
                    self._stream(answer, include_usage=_include_usage(body))
                else:
                    self._send(status, answer)
            elif path == "/reset":
                llm.reset()
                self._send(200, llm.stats())
            elif path == "/control":
                try:
                    llm.configure(**(body or {}))
                except (TypeError, ValueError) as exc:
                    self._send(400, _error(str(exc), "invalid_request_error"))
                    return
                self._send(200, {name: getattr(llm, name) for name in _KNOBS})
            else:
                self._send(404, _error(f"no route {self.path}", "not_found"))

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fake_llm", description="Fake OpenAI-compatible LLM server"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--latency-ms", type=float, default=0)
    parser.add_argument("--jitter-ms", type=float, default=0)
    parser.add_argument("--memories", type=int, default=3, help="memories per turn")
    parser.add_argument("--reword", action="store_true", help="word every call differently")
    parser.add_argument("--count-varies", action="store_true", help="vary the memory count")
    parser.add_argument("--fail-rate", type=float, default=0.0)
    parser.add_argument("--fail-status", type=int, default=500, choices=(429, 500, 502, 503))
    parser.add_argument("--garbage-rate", type=float, default=0.0)
    parser.add_argument("--fence", action="store_true", help="wrap answers in ```json fences")
    parser.add_argument("--api-key", default=None, help="require this bearer token")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    llm = FakeLLM(
        host=args.host,
        port=args.port,
        latency_ms=args.latency_ms,
        jitter_ms=args.jitter_ms,
        memories=args.memories,
        reword=args.reword,
        count_varies=args.count_varies,
        fail_rate=args.fail_rate,
        fail_status=args.fail_status,
        garbage_rate=args.garbage_rate,
        fence=args.fence,
        api_key=args.api_key,
        seed=args.seed,
    )
    stopping = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    llm.start()
    print(f"fake LLM listening: LLM_BASE_URL={llm.base_url}", flush=True)
    stopping.wait()
    llm.stop()
    print(json.dumps(llm.stats(), sort_keys=True), file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
