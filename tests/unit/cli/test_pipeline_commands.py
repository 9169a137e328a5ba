"""``ibex extract`` and ``ibex scan`` fail closed without a database."""

from __future__ import annotations

import pytest

from cli import main


@pytest.mark.parametrize(
    "command",
    [
        ["extract"],
        ["extract", "--session", "6f1c3a52-9d0e-4b8e-a3f1-0c2d4e6f8a10"],
        ["extract", "--session", "conv-1"],
        ["scan"],
    ],
)
def test_without_database_url_the_command_fails_naming_it(
    command: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    assert main(command) == 1
    err = capsys.readouterr().err
    assert "DATABASE_URL" in err and err.count("\n") == 1


def test_a_malformed_session_id_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["extract", "--session", "  "])
    assert exited.value.code == 2
    assert "not a session id" in capsys.readouterr().err


def test_the_pipeline_commands_are_registered(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in ("scan", "extract", "scheduler"))
