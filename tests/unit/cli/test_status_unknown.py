"""``ibex status``'s queue table: "unknown" where Redis gave no figures, never 0; its JSON:
null."""

from __future__ import annotations

from cli.status import as_json, render
from extraction.status import Status


def test_status_shows_unknown_queues_without_redis_figures() -> None:
    total = {"memories": 0}
    unread = render(Status([], total, {"extract": {"dead_mirror": 2}}))
    assert unread.splitlines()[-1].split() == ["extract", "unknown", "unknown", "unknown", "2"]
    read = render(
        Status(
            [], total, {"extract": {"ready": 3, "delayed": 0, "dead_redis": 1, "dead_mirror": 2}}
        )
    )
    assert read.splitlines()[-1].split() == ["extract", "3", "0", "1", "2"]


def test_status_json_has_null_for_queue_figures_redis_did_not_give() -> None:
    unread = as_json(Status([], {"memories": 0}, {"extract": {"dead_mirror": 2}}))
    assert unread["queues"] == {
        "extract": {"ready": None, "delayed": None, "dead_redis": None, "dead_mirror": 2}
    }
    figures = {"ready": 3, "delayed": 0, "dead_redis": 1, "dead_mirror": 2}
    read = as_json(Status([], {"memories": 0}, {"extract": dict(figures)}))
    assert read["queues"] == {"extract": figures}
