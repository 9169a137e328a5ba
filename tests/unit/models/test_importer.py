"""The import's line reader and its stop on database loss, without a database."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import sessions.importer as importer
from core.errors import DatabaseUnavailableError
from sessions.importer import ImportStopped, OversizeLine, import_lines, read_lines


class RecordingStream(io.BytesIO):
    """Records the largest piece handed out by one ``readline`` call."""

    largest = 0

    def readline(self, size: int | None = -1) -> bytes:
        data = super().readline(size)
        self.largest = max(self.largest, len(data))
        return data


def test_lines_come_without_their_newline_and_the_last_may_lack_one() -> None:
    stream = io.BytesIO(b"one\r\n\ntwo\nlast")
    assert list(read_lines(stream, max_bytes=100)) == [b"one\r", b"", b"two", b"last"]


def test_the_limit_counts_bytes_without_the_newline() -> None:
    stream = io.BytesIO(b"12345\n123456\n12345")
    assert list(read_lines(stream, max_bytes=5)) == [b"12345", OversizeLine(6, 5), b"12345"]
    assert list(read_lines(io.BytesIO(b"123456"), max_bytes=5)) == [OversizeLine(6, 5)]


def test_an_over_long_line_is_skipped_in_bounded_reads() -> None:
    stream = RecordingStream(b"short\n" + b"x" * 1_000_000 + b"\nafter\n")
    lines = list(read_lines(stream, max_bytes=100, chunk=64))
    assert lines == [b"short", OversizeLine(1_000_000, 100), b"after"]
    assert stream.largest <= 101


class _Lines:
    """An iterator of lines that records how far it was read."""

    def __init__(self, lines: list[bytes]) -> None:
        self.lines = lines
        self.read = 0

    def __iter__(self) -> Iterator[bytes]:
        for line in self.lines:
            self.read += 1
            yield line


def test_losing_the_database_stops_the_import_at_that_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Fault injected: the database connection is lost while line 3 is being imported.
    calls: list[str] = []

    def fake_import(store: Any, record: dict[str, Any]) -> tuple[uuid.UUID, bool, int]:
        calls.append(record["session"])
        if record["session"] == "s3":
            raise DatabaseUnavailableError("database unavailable: server closed the connection\n")
        return uuid.uuid4(), True, 0

    monkeypatch.setattr(importer, "import_session", fake_import)
    line = b'{"org": "acme", "agent": "bot", "session": "s%d", "turns": []}'
    source = _Lines([line % 1, b"{bad", line % 3, line % 4, line % 5])
    with pytest.raises(ImportStopped) as info:
        import_lines(None, source, keep_lines=True)  # type: ignore[arg-type]
    stopped = info.value
    assert stopped.line == 3
    assert str(stopped) == "database unavailable: server closed the connection"
    assert calls == ["s1", "s3"] and source.read == 3
    assert [i.line for i in stopped.report.imported] == [1]
    assert [e.line for e in stopped.report.errors] == [2]
    assert stopped.report.sessions_created == 1


class _Deadlock(Exception):
    pgcode = "40P01"


def test_a_line_that_loses_a_race_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # Fault injected: line 1's first transaction is chosen as a deadlock victim.
    attempts: list[str] = []

    def fake_import(store: Any, record: dict[str, Any]) -> tuple[uuid.UUID, bool, int]:
        attempts.append(record["session"])
        if len(attempts) == 1:
            raise DatabaseUnavailableError("deadlock detected") from _Deadlock()
        return uuid.uuid4(), True, 2

    monkeypatch.setattr(importer, "import_session", fake_import)
    line = b'{"org": "acme", "agent": "bot", "session": "s1", "turns": []}'
    report = import_lines(None, [line])  # type: ignore[arg-type]
    assert attempts == ["s1", "s1"]
    assert (report.sessions_created, report.turns_added, report.errors) == (1, 2, [])


def test_a_line_that_keeps_losing_races_stops_the_import(monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[str] = []

    def fake_import(store: Any, record: dict[str, Any]) -> tuple[uuid.UUID, bool, int]:
        attempts.append(record["session"])
        raise DatabaseUnavailableError("deadlock detected") from _Deadlock()

    monkeypatch.setattr(importer, "import_session", fake_import)
    line = b'{"org": "acme", "agent": "bot", "session": "s1", "turns": []}'
    with pytest.raises(ImportStopped, match="deadlock detected"):
        import_lines(None, [line, line])  # type: ignore[arg-type]
    assert attempts == ["s1"] * importer.LINE_ATTEMPTS
