"""The web's gunicorn worker class at process start: the thread switch interval is shortened
before its event loop runs (core.threads)."""

from __future__ import annotations

import sys

import pytest
from gunicorn.workers.gthread import ThreadWorker

from core.threads import SWITCH_INTERVAL_S
from memory_service.gunicorn_worker import BufferingThreadWorker


def test_a_web_worker_process_start_shortens_the_thread_switch_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Recorded instead of applied to the test process; gthread's own start (the event
    loop) is not run."""
    applied: list[float] = []
    monkeypatch.setattr(sys, "setswitchinterval", applied.append)
    monkeypatch.setattr(ThreadWorker, "init_process", lambda self: None)
    worker = BufferingThreadWorker.__new__(BufferingThreadWorker)
    worker.init_process()
    assert applied == [SWITCH_INTERVAL_S]
    assert SWITCH_INTERVAL_S < 0.005  # Python's default
    assert worker.read_seconds > 0  # the rest of the start ran as before
