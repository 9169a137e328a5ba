"""Reading an OpenAI-compatible SSE stream as it passes through: the completion it adds up to.

The proxy relays the upstream's bytes unchanged, chunk by chunk, and feeds the same bytes to a
:class:`StreamAssembler`, which parses the ``data:`` lines and accumulates the first choice's
message (content, tool calls), the finish reason and ``usage`` when the upstream sends it
(``stream_options.include_usage``). A stream is complete when ``data: [DONE]`` arrived; one
cut before that (the upstream broke, or the client left) is recorded with ``is_complete``
false and the content received so far.
"""

from __future__ import annotations

import json
from typing import Any


class StreamAssembler:
    def __init__(self) -> None:
        self._buffer = b""
        self.content: list[str] = []
        self.role = "assistant"
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.model: str | None = None

    def feed(self, data: bytes) -> None:
        self._buffer += data
        while True:
            cut = self._buffer.find(b"\n")
            if cut < 0:
                return
            line, self._buffer = self._buffer[:cut].rstrip(b"\r"), self._buffer[cut + 1 :]
            self._line(line)

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            event = json.loads(payload)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        if isinstance(event.get("usage"), dict):
            self.usage = event["usage"]
        if isinstance(event.get("model"), str):
            self.model = event["model"]
        choices = event.get("choices")
        if not isinstance(choices, list):
            return
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
            delta = choice.get("delta")
            if isinstance(delta, dict):
                self._delta(delta)

    def _delta(self, delta: dict[str, Any]) -> None:
        if isinstance(delta.get("role"), str):
            self.role = delta["role"]
        if isinstance(delta.get("content"), str):
            self.content.append(delta["content"])
        for call in delta.get("tool_calls") or []:
            if not isinstance(call, dict):
                continue
            slot = self.tool_calls.setdefault(
                int(call.get("index", 0)),
                {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
            )
            if call.get("id"):
                slot["id"] = call["id"]
            function = call.get("function") or {}
            if function.get("name"):
                slot["function"]["name"] += function["name"]
            if function.get("arguments"):
                slot["function"]["arguments"] += function["arguments"]

    def message(self) -> dict[str, Any]:
        """The assistant message received so far."""
        message: dict[str, Any] = {"role": self.role, "content": "".join(self.content)}
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return message
