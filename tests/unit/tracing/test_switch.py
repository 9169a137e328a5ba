"""Traces are off unless the standard variables ask for them, and off they cost no import."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from core import tracing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "x"}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, False),
        ({"OTEL_TRACES_EXPORTER": "none, console"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "TRUE"}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "false"}, True),
    ],
)
def test_the_standard_variables_decide(env: dict[str, str], on: bool) -> None:
    assert tracing.wanted(env) is on


def test_off_every_helper_is_a_no_op() -> None:
    assert not tracing.enabled()
    with tracing.span("x", kind="client", attributes={"a": 1}) as span:
        assert span is None
    assert tracing.begin("x") is None
    assert tracing.inject({"k": "v"}) == {"k": "v"}
    assert tracing.parent_of({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}) is None
    assert tracing.root() is None and tracing.current_link() == [] and not tracing.has_current()
    assert tracing.setup("ibex-test", {}) is False and not tracing.enabled()


PROBE = """
import json, os, sys
if os.environ.get("PROBE_BLOCK_OTEL"):
    import importlib.abc

    class Blocked(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "opentelemetry":
                raise ImportError(f"blocked: {name}")
            return None

    sys.meta_path.insert(0, Blocked())
import actors
from actors.broker import current_broker
from actors.tracing import TraceMessages
import extraction.providers, extraction.memory_client, memory_service.app, proxy.app, proxy.spool
from core import tracing
print(json.dumps({
    "setup": tracing.setup("ibex-worker"),
    "otel": sorted(m for m in sys.modules if m.startswith("opentelemetry")),
    "middleware": [type(m).__name__ for m in current_broker().middleware],
}))
"""


def _probe(extra: dict[str, str]) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(extra)
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


#: What traces on would load; the redis client imports OpenTelemetry's metrics API by itself
#: whenever it is installed, so the whole namespace cannot be the test.
TRACING_MODULES = ("opentelemetry.sdk.trace", "opentelemetry.exporter", "opentelemetry.propagate")


def test_off_by_default_no_tracing_module_is_imported_and_the_broker_has_no_tracing() -> None:
    found = _probe({})
    assert found["setup"] is False
    loaded = [m for m in found["otel"] if str(m).startswith(TRACING_MODULES)]  # type: ignore[union-attr]
    assert loaded == []
    assert "tracecontext" not in " ".join(map(str, found["otel"]))  # type: ignore[call-overload]
    assert "TraceMessages" not in found["middleware"]


def test_without_opentelemetry_installed_everything_imports_and_traces_stay_off() -> None:
    found = _probe({"PROBE_BLOCK_OTEL": "1"})
    assert found["setup"] is False and found["otel"] == []
    # Asked for, but the extra is missing: one warning, traces off, the worker runs.
    found = _probe({"PROBE_BLOCK_OTEL": "1", "OTEL_TRACES_EXPORTER": "otlp"})
    assert found["setup"] is False and found["otel"] == []


def test_asked_for_the_worker_traces_its_messages() -> None:
    # An endpoint nobody listens on: nothing is exported in this probe (no span is ended).
    found = _probe({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    assert found["setup"] is True
    assert found["middleware"][-1] == "TraceMessages"


def test_a_span_names_only_the_standard_http_methods() -> None:
    assert tracing.http_method("POST") == "POST"
    assert tracing.http_method("SECRETWORD") == "_OTHER"
