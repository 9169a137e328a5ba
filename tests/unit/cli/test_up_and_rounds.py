"""``ibex up``'s token check and options, and the scheduler's round line."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from cli import build_parser, up
from cli.scheduler import round_line


def _answer(status: int, body: dict[str, Any]) -> Any:
    def post(url: str, **kwargs: Any) -> httpx.Response:
        assert url == "http://svc/v1/memories"
        assert kwargs["headers"]["Authorization"] == "Bearer tok"
        assert kwargs["headers"]["X-IBEX-Org-ID"] == up.PROBE_ORG
        return httpx.Response(status, json=body)

    return post


@pytest.mark.parametrize(
    ("status", "code", "ok", "says"),
    [
        (422, "VALIDATION_FAILED", True, "accepts the worker's token"),
        (401, "UNAUTHORIZED", False, "does not know this token"),
        (403, "INSUFFICIENT_SCOPE", False, "lacks the memory:write scope"),
        (400, "ORG_REQUIRED", False, "not a service token"),
        (403, "FORBIDDEN_ORG", False, "not a service token"),
        (404, "NOT_FOUND", False, "unexpected answer"),
    ],
)
def test_check_token_says_what_the_service_answered(
    monkeypatch: pytest.MonkeyPatch, status: int, code: str, ok: bool, says: str
) -> None:
    monkeypatch.setattr(httpx, "post", _answer(status, {"error": {"code": code}}))
    result, line = up.check_token("http://svc/", "tok")
    assert result is ok
    assert says in line


def test_check_token_without_a_service(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(url: str, **kwargs: Any) -> httpx.Response:
        raise httpx.ConnectError("refused")

    monkeypatch.setattr(httpx, "post", refuse)
    assert up.check_token("http://svc", "tok") == (
        False,
        "no memory service answers at http://svc (ConnectError)",
    )


def test_up_options_and_defaults() -> None:
    args = build_parser().parse_args(["up"])
    assert (args.port, args.scan_interval, args.check) == (8000, 2, False)
    args = build_parser().parse_args(["up", "--port", "9001", "--check"])
    assert (args.port, args.check) == (9001, True)


def test_round_line() -> None:
    assert (
        round_line(0, True) == "ibex scheduler: round: closed 0 idle sessions, sent scan_sessions"
    )
    assert round_line(1, True).endswith("closed 1 idle session, sent scan_sessions")
    assert round_line(None, False).endswith("closed ? idle sessions, scan_sessions NOT sent")
