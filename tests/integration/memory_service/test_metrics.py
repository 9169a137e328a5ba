"""GET /metrics: the series docs/operations.md documents, with the counts of the requests made,
no tenant data in any label, in one process and summed over several (multiprocess mode)."""

from __future__ import annotations

import multiprocessing
import pathlib
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client import values
from prometheus_client.parser import text_string_to_metric_families

from core.config import Settings
from memory_service.app import create_app
from tests.integration.memory_service.helpers import BASE_URL, Tenant, memory_body

ROOT = pathlib.Path(__file__).resolve().parents[3]
CREATE = "/v1/memories"
ONE = "/v1/memories/{memory_id:uuid}"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample by (name, sorted labels)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(scraped: dict[Any, float], name: str, **labels: str) -> float:
    return scraped.get((name, tuple(sorted(labels.items()))), 0.0)


def exercise(http: httpx.Client, acme: Tenant) -> None:
    """2 created, 1 replay, 1 key conflict, 1 duplicate content, 1 401, 1 GET, 1 404."""
    body = memory_body(acme.agent_id)
    post = lambda b, key: http.post(CREATE, json=b, headers=acme.headers(key=key))  # noqa: E731
    created = post(body, "k1")
    assert created.status_code == 201
    assert post(body, "k1").headers["Idempotent-Replayed"] == "true"
    assert post(memory_body(acme.agent_id, "Another"), "k1").status_code == 409
    assert post(body, "k2").json()["error"]["code"] == "DUPLICATE_CONTENT"
    assert post(memory_body(acme.agent_id, "Third"), None).status_code == 201
    assert http.post(CREATE, json=body).status_code == 401
    assert http.get(created.headers["Location"], headers=acme.headers()).status_code == 200
    assert http.get("/nowhere/" + str(acme.org_id)).status_code == 404


def check_counts(scraped: dict[Any, float], times: int = 1) -> None:
    requests = "ibex_memory_http_requests_total"
    assert value(scraped, requests, route=CREATE, method="POST", status="201") == 3 * times
    assert value(scraped, requests, route=CREATE, method="POST", status="409") == 2 * times
    assert value(scraped, requests, route=CREATE, method="POST", status="401") == 1 * times
    assert value(scraped, requests, route=ONE, method="GET", status="200") == 1 * times
    assert value(scraped, requests, route="(unmatched)", method="GET", status="404") == times
    duration = "ibex_memory_http_request_duration_seconds"
    assert value(scraped, duration + "_count", route=CREATE, method="POST") == 6 * times
    assert value(scraped, duration + "_bucket", route=CREATE, method="POST", le="+Inf") == (
        6 * times
    )
    assert value(scraped, duration + "_sum", route=CREATE, method="POST") > 0
    assert value(scraped, "ibex_memory_idempotent_replays_total", source="redis") == times
    assert value(scraped, "ibex_memory_idempotent_replays_total", source="postgres") == 0
    conflicts = "ibex_memory_conflicts_total"
    assert value(scraped, conflicts, code="IDEMPOTENCY_CONFLICT") == times
    assert value(scraped, conflicts, code="DUPLICATE_CONTENT") == times
    assert value(scraped, conflicts, code="IDEMPOTENCY_IN_PROGRESS") == 0
    assert value(scraped, "ibex_memory_idempotency_unavailable_total") == 0


def test_metrics_count_the_requests(http: httpx.Client, acme: Tenant) -> None:
    exercise(http, acme)
    response = http.get("/metrics")  # no token needed
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    check_counts(samples(response.text))
    # No tenant data: no org id, no path with an id, no key in the text.
    assert str(acme.org_id) not in response.text
    assert "k1" not in response.text and "/nowhere" not in response.text
    assert not re.search(r"[0-9a-f]{8}-[0-9a-f]{4}-", response.text)


def test_every_documented_series_is_served_and_every_served_one_documented(
    http: httpx.Client, acme: Tenant
) -> None:
    exercise(http, acme)
    served = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in text_string_to_metric_families(http.get("/metrics").text)
        if not family.name.endswith("_created")  # the text parser's view of the timestamps
    }
    operations = (ROOT / "docs" / "operations.md").read_text()
    section = operations.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`(ibex_memory_[a-z_]+)", section))
    assert served == documented


def test_requests_during_a_redis_outage_are_counted(
    settings: Settings, app_db: Any, acme: Tenant
) -> None:
    from memory_service.app import make_redis

    app = create_app(settings, db=app_db, redis_client=make_redis("redis://127.0.0.1:1/0"))
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url=BASE_URL) as http:
        body = memory_body(acme.agent_id)
        assert http.post(CREATE, json=body, headers=acme.headers(key="k")).status_code == 201
        again = http.post(CREATE, json=body, headers=acme.headers(key="k"))
        assert again.headers["Idempotent-Replayed"] == "true"
        scraped = samples(http.get("/metrics").text)
    assert value(scraped, "ibex_memory_idempotency_unavailable_total") == 2
    assert value(scraped, "ibex_memory_idempotent_replays_total", source="postgres") == 1


@pytest.fixture
def multiprocess_dir(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Multiprocess mode for this test only: prometheus_client's process-wide value class and
    its environment variable are put back afterwards."""
    monkeypatch.setattr(values, "ValueClass", values.ValueClass)
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    yield str(tmp_path / "metrics")


def _worker_process(settings: Settings, database_url: str, acme: Tenant) -> None:
    """Another gunicorn worker: its own process, app and pool, the same directory."""
    from memory_service.app import make_web_pool

    pool = make_web_pool(database_url, max_connections=2)
    app = create_app(settings, db=pool)
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url=BASE_URL) as http:
        body = memory_body(acme.agent_id, "From the other worker")
        assert http.post(CREATE, json=body, headers=acme.headers(key="w2")).status_code == 201
    pool.close_all()


def test_multiprocess_mode_sums_every_worker(
    settings: Settings,
    database_url: str,
    app_db: Any,
    redis_client: Any,
    acme: Tenant,
    multiprocess_dir: str,
) -> None:
    settings = Settings.from_env(
        {
            "DATABASE_URL": database_url,
            "REDIS_URL": settings.redis_url,
            "PROMETHEUS_MULTIPROC_DIR": multiprocess_dir,
        }
    )
    assert settings.prometheus_multiproc_dir == multiprocess_dir
    app = create_app(settings, db=app_db, redis_client=redis_client)
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url=BASE_URL) as http:
        exercise(http, acme)
        other = multiprocessing.get_context("fork").Process(
            target=_worker_process, args=(settings, database_url, acme)
        )
        other.start()
        other.join(30)
        assert other.exitcode == 0
        scraped = samples(http.get("/metrics").text)
    assert len(list(pathlib.Path(multiprocess_dir).glob("*.db"))) >= 2
    requests = "ibex_memory_http_requests_total"
    # 3 created here, 1 in the other process: the scrape sums both.
    assert value(scraped, requests, route=CREATE, method="POST", status="201") == 4
    assert value(scraped, requests, route=CREATE, method="POST", status="409") == 2
    assert value(scraped, "ibex_memory_conflicts_total", code="DUPLICATE_CONTENT") == 1
