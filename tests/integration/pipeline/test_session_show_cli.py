"""``ibex session show``: a conversation's turns with the states the pipeline left them in,
their memories and usage; no conversation text in the table."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cli import main
from core.errors import PermanentError
from extraction.stages import Send, scan
from extraction.values import TurnRef
from tests.integration.pipeline.helpers import FakeProvider, Harness, make_session


def test_session_show_prints_each_turn_with_its_state_and_usage(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    database_url: str,
    store: Any,
    deps: Any,
    provider: FakeProvider,
) -> None:
    monkeypatch.setenv("DATABASE_URL", database_url)
    ref = make_session(store, 4, external_id="conv-7")
    provider.reject_always(ref.session_id, 3)

    def dead_letter(message: Send, exc: BaseException) -> bool:
        assert isinstance(exc, PermanentError)
        k = message.kwargs
        deps.turns.mark_failed(
            TurnRef.of(k["org_id"], k["session_id"], k["turn_index"]), f"{type(exc).__name__}: x"
        )
        return True

    Harness(deps).drain(scan(deps).sent, dead_letter=dead_letter)
    assert main(["session", "show", "--org", "acme", "--agent", "bot", "conv-7"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "4 turns; dead_lettered 1, extracted 3; pointer 2" in lines[0]
    rows = {line.split()[0]: line.split() for line in lines[2:6]}
    assert rows["1"][:6] == ["1", "extracted", "2", "1", "11/7", "0.000000"]
    assert rows["3"][:2] == ["3", "dead_lettered"]
    assert rows["3"][-1] == "LLMRejectedError"
    assert "ibex dlq replay" in out
    assert "colour" not in out  # no conversation text in the table

    assert main(["session", "show", "--org", "acme", "--agent", "bot", "conv-7", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["sessions"]
    assert len(shown) == 1 and shown[0]["states"] == {"extracted": 3, "dead_lettered": 1}
    turns = shown[0]["turns"]
    assert [t["state"] for t in turns] == ["extracted", "extracted", "dead_lettered", "extracted"]
    assert turns[0]["usage"]["llm_calls"] == 1 and turns[2]["usage"] is None
    assert turns[0]["messages"][0]["content"].startswith("I like colour number 1")

    assert main(["session", "show", "--org", "acme", "--agent", "bot", "conv-404"]) == 1
    assert "no live session 'conv-404'" in capsys.readouterr().err
