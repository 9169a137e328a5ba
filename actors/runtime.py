"""The worker process's runtime: the stage dependencies every actor runs with.

Built once when a worker process boots (``actors.middleware.PipelineRuntime``), or installed by
a test or ``ibex extract``, and given to each actor when it is declared
(:func:`actors.stage.stage_actor`): an actor reads it from the runtime it was declared with,
not from a thread-local or a lookup per message. It knows no broker, so the broker's
middleware and the actors can both import it.
"""

from __future__ import annotations

import threading

from core.errors import ConfigError
from extraction.stages import StageDeps


class WorkerRuntime:
    """What a worker process runs its stages with: the dependencies built once when the process
    boots (``actors.middleware.PipelineRuntime``), or installed by a test or ``ibex extract``."""

    def __init__(self) -> None:
        self._deps: StageDeps | None = None
        self._lock = threading.Lock()

    def install(self, deps: StageDeps | None) -> None:
        with self._lock:
            self._deps = deps

    @property
    def installed(self) -> StageDeps | None:
        return self._deps

    @property
    def deps(self) -> StageDeps:
        """The dependencies; a ConfigError when nothing installed them."""
        deps = self._deps
        if deps is None:
            raise ConfigError(
                "the pipeline is not configured in this process (DATABASE_URL is not set?)",
                variable="DATABASE_URL",
            )
        return deps


#: The worker process's runtime, which every actor is declared with.
WORKER = WorkerRuntime()
