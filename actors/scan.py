"""``scan_sessions(session_id=None)``: find completed sessions with unextracted turns, record
them, and send ``extract_turn`` for each turn not done, not failed and not leased.

Running it twice is safe: turns are recorded with ``ON CONFLICT DO NOTHING`` and a turn is sent
only after its lease was taken in the same transaction (``FOR UPDATE SKIP LOCKED``), so while
the leases are live a second scan sends nothing; once a lease expires the turn is sent again,
which is the backstop for messages the broker lost.
"""

from __future__ import annotations

import logging
from functools import partial

from actors.broker import current_broker
from actors.stage import stage_actor
from extraction.dispatch import ROUTES
from extraction.metrics import PipelineMetrics
from extraction.queues import queue_counts
from extraction.stages import StageDeps
from extraction.status import collect
from schema.messages import WORKER_QUEUES, ActorName

log = logging.getLogger(__name__)


def observe_backlog(deps: StageDeps, sent: int) -> None:
    """Log what the scan sent and refresh the backlog gauges (when metrics are on): once per
    scan is often enough."""
    log.info("scan: sent %d turn%s to extract", sent, "" if sent == 1 else "s")
    metrics = getattr(deps, "metrics", None)
    if metrics is None or type(metrics) is PipelineMetrics:
        return
    try:
        client = getattr(current_broker(), "client", None)
        status = collect(
            deps.store.db,
            partial(queue_counts, client) if client is not None else None,
            queues=list(WORKER_QUEUES),
        )
        metrics.backlog(status)
    except Exception:
        # Metrics never fail a scan.
        log.warning("could not refresh the backlog gauges", exc_info=True)


@stage_actor(ROUTES[ActorName.SCAN], after=observe_backlog)
def scan_sessions(session_id: str | None = None) -> None:
    """One scan: :func:`extraction.stages.scan`."""
