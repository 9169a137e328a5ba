"""The spans of the pipeline's two outgoing calls, as decorators on the methods that make them.

- :func:`llm_call` around a provider's ``extract``: ``chat <model>`` (client), in the GenAI
  semantic conventions: ``gen_ai.operation.name``, ``gen_ai.provider.name`` (and the older
  ``gen_ai.system``), ``gen_ai.request.model``, and from the answer ``gen_ai.response.model``,
  ``gen_ai.usage.input_tokens`` and ``gen_ai.usage.output_tokens``. No prompt, no completion.
- :func:`memory_post` around the memory client's ``create_memory``: ``POST /v1/memories``
  (client) with the org and the answer's status; the method puts the span's ``traceparent`` in
  its request headers (:func:`core.tracing.inject`), so the memory service's span joins it.

Off (:func:`core.tracing.enabled` false), each decorated call costs one check.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from core import tracing

F = TypeVar("F", bound=Callable[..., Any])


def _server(url: str | None) -> dict[str, Any]:
    if not url:
        return {}
    parts = urlsplit(url)
    return {"server.address": parts.hostname, "server.port": parts.port}


def llm_call(method: F) -> F:
    """Trace a provider's ``extract(turn, context, related)`` as a GenAI chat span."""

    @functools.wraps(method)
    def traced(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not tracing.enabled():
            return method(self, *args, **kwargs)
        model = str(getattr(self, "model", "") or "")
        provider = str(getattr(self, "name", "") or "")
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.system": provider,
            "gen_ai.request.model": model,
            **_server(getattr(self, "base_url", None)),
        }
        with tracing.span(f"chat {model}", kind="client", attributes=attributes) as span:
            result = method(self, *args, **kwargs)
            span.set_attribute("gen_ai.usage.input_tokens", int(result.prompt_tokens or 0))
            span.set_attribute("gen_ai.usage.output_tokens", int(result.completion_tokens or 0))
            if result.model:
                span.set_attribute("gen_ai.response.model", str(result.model))
            return result

    return traced  # type: ignore[return-value]


def memory_post(method: F) -> F:
    """Trace the memory client's ``create_memory(org_id, body, key)`` as an HTTP client span."""

    @functools.wraps(method)
    def traced(self: Any, org_id: Any, *args: Any, **kwargs: Any) -> Any:
        if not tracing.enabled():
            return method(self, org_id, *args, **kwargs)
        attributes = {
            "http.request.method": "POST",
            "url.template": "/v1/memories",
            "ibex.org_id": str(org_id),
            **_server(getattr(self, "base_url", None)),
        }
        with tracing.span("POST /v1/memories", kind="client", attributes=attributes) as span:
            try:
                result = method(self, org_id, *args, **kwargs)
            except Exception as exc:
                status = getattr(exc, "status", None)
                if isinstance(status, int):
                    span.set_attribute("http.response.status_code", status)
                raise
            span.set_attribute("http.response.status_code", int(result.status))
            return result

    return traced  # type: ignore[return-value]


__all__ = ["llm_call", "memory_post"]
