"""The proxy process refuses to start without somewhere to forward to."""

from __future__ import annotations

import pytest

from proxy import asgi


def test_the_proxy_exits_with_one_line_naming_the_missing_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://postgres@127.0.0.1:1/none")
    monkeypatch.delenv("UPSTREAM_LLM_BASE_URL", raising=False)
    with pytest.raises(SystemExit) as exited:
        asgi.application()
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "UPSTREAM_LLM_BASE_URL" in err
