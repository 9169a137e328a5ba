"""The ``proxy`` process's app: ``uvicorn --factory proxy.asgi:application`` (Procfile).

Configuration comes from the environment only; a missing ``UPSTREAM_LLM_BASE_URL`` or
``DATABASE_URL`` stops the process at start with a one-line error naming the variable.
"""

from __future__ import annotations

import sys

from starlette.applications import Starlette

from core import tracing
from core.config import Settings
from core.errors import ConfigError
from proxy.app import create_app

#: The process's ``service.name`` in traces unless ``OTEL_SERVICE_NAME`` is set.
SERVICE = "ibex-proxy"


def application() -> Starlette:
    tracing.setup(SERVICE)
    try:
        app, _ = create_app(Settings.from_env())
    except ConfigError as exc:
        print(f"ibex proxy: configuration error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    return app
