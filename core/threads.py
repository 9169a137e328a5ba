"""The thread switch interval of the processes that serve round trips with threads: the
worker (``actors.middleware.PipelineRuntime``, at process boot) and the web (its gunicorn
worker class, ``memory_service.gunicorn_worker``, at process start).

Their threads spend most of their time waiting on I/O (the LLM, the memory service, Postgres,
Redis): dozens of round trips per turn in a worker, several per request in the web, after
each of which the thread needs the GIL back. While another thread runs Python that takes up
to the switch interval (``sys.setswitchinterval``; Python's default is 5 ms), so at 5 ms the
waits add up to a large share of a message's or a request's time: an LLM call of 200 ms held
its worker thread for 250 ms and more, and a memory POST the web served in 13 ms kept the
worker that sent it waiting 30. Shorter slices give the GIL back sooner; the threads' CPU is
unchanged.
"""

from __future__ import annotations

import sys

#: The switch interval of the worker and web processes (module docstring).
SWITCH_INTERVAL_S = 0.001


def switch_often() -> None:
    """Set this process's thread switch interval to :data:`SWITCH_INTERVAL_S`."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
