"""The gunicorn entry point (Procfile ``web``): ``memory_service.wsgi:application``.

Building the app here, at import, is the one place that is allowed: gunicorn imports this module
in each worker process after forking, so every worker gets its own pool and Redis client.
"""

from __future__ import annotations

from core import tracing
from core.config import Settings
from memory_service.app import create_app
from memory_service.tracing import WEB_SERVICE

tracing.setup(WEB_SERVICE)  # after the fork: the span exporter's thread is this worker's own
application = create_app(Settings.from_env())
