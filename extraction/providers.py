"""Extraction providers: turn one stored turn into an :class:`ExtractionResult`.

- :class:`OpenAICompatibleProvider` (``LLM_PROVIDER=openai``): one chat completion request to
  any OpenAI-compatible endpoint (OpenAI, vLLM, Ollama, llama.cpp server, LM Studio, ...).
- :class:`RulesProvider` (``LLM_PROVIDER=rules``, the default without ``LLM_BASE_URL``): the
  deterministic offline extractor of :mod:`extraction.rules`.

Failures are classified for the queue, here and nowhere else for httpx:
429, 5xx, 408 and client-side timeouts, connection errors and unusable answers raise
:class:`~core.errors.LLMUnavailableError` (retried with backoff); other 4xx raise
:class:`~core.errors.LLMRejectedError` (dead-lettered at once: the request or the
configuration is wrong). A failure is never returned as "no memories". The API key never
appears in an exception message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import httpx

from core import fastjson
from core.config import Settings, redact_url
from core.errors import ConfigError, LLMRejectedError, LLMUnavailableError
from core.http import CookielessClient, endpoint_url
from extraction.prompt import RelatedMemory, build_messages
from extraction.result import ExtractionResult, parse_llm_content
from extraction.rules import RULES_MODEL, extract_changes
from extraction.tracing import llm_call
from sessions.turns import TurnRecord

#: How much of an error response body an exception message quotes.
ERROR_BODY_CHARS = 300


class Provider(Protocol):
    """Anything that extracts the memories of one turn."""

    name: str
    model: str

    def extract(
        self, turn: TurnRecord, context: Sequence[TurnRecord], related: Sequence[RelatedMemory] = ()
    ) -> ExtractionResult:
        """The memories of ``turn``; ``context`` holds earlier turns, not to be extracted;
        ``related`` the scope's current memories a new memory may replace (by ref)."""
        ...


class RulesProvider:
    """Deterministic offline extraction of first-person statements; no network, no tokens."""

    name = "rules"
    model = RULES_MODEL

    def extract(
        self, turn: TurnRecord, context: Sequence[TurnRecord], related: Sequence[RelatedMemory] = ()
    ) -> ExtractionResult:
        listed = [(m.ref, m.content) for m in related]
        return ExtractionResult(
            memories=tuple(extract_changes(turn, listed)), provider=self.name, model=self.model
        )


def _int_or_zero(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


class OpenAICompatibleProvider:
    """``POST {base_url}/chat/completions`` with a JSON-object response format.

    ``client`` is the process's shared httpx client (or an ``httpx.MockTransport`` client in
    tests); without one the provider opens its own, closed by :meth:`close`. ``timeout``
    applies to every request either way.
    """

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        timeout: float,
        client: httpx.Client | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._api_key = api_key or None
        self.timeout = timeout
        self._own_client = client is None
        self._client = client if client is not None else CookielessClient(timeout=timeout)
        self.url = endpoint_url(f"{self.base_url}/chat/completions", "LLM_BASE_URL")
        self._safe_url = redact_url(str(self.url))

    def __repr__(self) -> str:
        return f"OpenAICompatibleProvider(url={self._safe_url!r}, model={self.model!r})"

    def close(self) -> None:
        """Close the client this provider opened itself (a passed-in client is left alone)."""
        if self._own_client:
            self._client.close()

    def _scrub(self, text: str) -> str:
        """``text`` with the API key masked, should a server or library echo it."""
        if self._api_key:
            text = text.replace(self._api_key, "***")
        return text

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def request_body(
        self, turn: TurnRecord, context: Sequence[TurnRecord], related: Sequence[RelatedMemory] = ()
    ) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": build_messages(turn, context, related),
            "response_format": {"type": "json_object"},
            "temperature": 0,
        }

    @llm_call
    def extract(
        self, turn: TurnRecord, context: Sequence[TurnRecord], related: Sequence[RelatedMemory] = ()
    ) -> ExtractionResult:
        body = self.request_body(turn, context, related)
        try:
            # The body written by orjson (a prompt of some kilobytes: a fifth of json.dumps's
            # time); the headers say it is JSON, as httpx's ``json=`` would.
            response = self._client.post(
                self.url,
                content=fastjson.dumps(body).encode("utf-8"),
                headers=self._headers(),
                timeout=self.timeout,
            )
        except httpx.TimeoutException as exc:
            raise LLMUnavailableError(
                f"LLM request to {self._safe_url} timed out after {self.timeout:g}s"
                f" ({type(exc).__name__})"
            ) from exc
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            raise LLMRejectedError(
                f"LLM URL {self._safe_url} is not usable: {self._scrub(str(exc))}"
            ) from exc
        except httpx.TransportError as exc:
            raise LLMUnavailableError(
                f"LLM request to {self._safe_url} failed: {type(exc).__name__}:"
                f" {self._scrub(str(exc))}"
            ) from exc
        self._raise_for_status(response)
        content, payload = self._content(response)
        memories = parse_llm_content(content)
        usage = payload.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        model = payload.get("model")
        return ExtractionResult(
            memories=tuple(memories),
            prompt_tokens=_int_or_zero(usage.get("prompt_tokens")),
            completion_tokens=_int_or_zero(usage.get("completion_tokens")),
            provider=self.name,
            model=model if isinstance(model, str) and model else self.model,
        )

    def _raise_for_status(self, response: httpx.Response) -> None:
        status = response.status_code
        if 200 <= status < 300:
            return
        detail = self._scrub(" ".join(response.text[:ERROR_BODY_CHARS].split()))
        message = f"LLM endpoint {self._safe_url} answered {status}" + (
            f": {detail}" if detail else ""
        )
        if status == 429 or status >= 500 or status == 408:
            raise LLMUnavailableError(message, status=status)
        raise LLMRejectedError(message, status=status)

    def _content(self, response: httpx.Response) -> tuple[str, dict[str, Any]]:
        """The assistant's text and the whole response object; a malformed response is an
        LLMUnavailableError (the endpoint had a bad moment; a retry may get a good answer)."""
        try:
            payload = fastjson.loads(response.content)  # as response.json(), faster
        except ValueError as exc:
            raise LLMUnavailableError(
                f"LLM endpoint {self._safe_url} answered {response.status_code} with a body"
                " that is not JSON",
                status=response.status_code,
            ) from exc
        if not isinstance(payload, dict):
            raise LLMUnavailableError("LLM response is not a JSON object")
        choices = payload.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise LLMUnavailableError("LLM response has no choices")
        message = choices[0].get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, str) or not content.strip():
            finish = choices[0].get("finish_reason")
            raise LLMUnavailableError(f"LLM response has no content (finish_reason={finish!r})")
        return content, payload


def make_provider(settings: Settings, *, client: httpx.Client | None = None) -> Provider:
    """The provider ``settings.llm_provider`` names."""
    if settings.llm_provider == "rules":
        return RulesProvider()
    if settings.llm_provider == "openai":
        if not settings.llm_base_url:
            raise ConfigError("LLM_PROVIDER=openai needs LLM_BASE_URL", variable="LLM_BASE_URL")
        return OpenAICompatibleProvider(
            settings.llm_base_url,
            settings.llm_model,
            settings.llm_api_key,
            timeout=float(settings.llm_timeout_seconds),
            client=client,
        )
    raise ConfigError(f"unknown LLM_PROVIDER {settings.llm_provider!r}", variable="LLM_PROVIDER")


__all__ = ["OpenAICompatibleProvider", "Provider", "RulesProvider", "make_provider"]
