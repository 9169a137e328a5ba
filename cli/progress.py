"""A one-line progress display for terminals; silent when the stream is not a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """``Progress(total=None).update(done, detail)`` redraws at most ten times a second."""

    def __init__(self, label: str, total: int | None = None, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last = 0.0
        self._started = time.monotonic()
        self._drawn = False

    def update(self, done: int, detail: str = "", *, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        if self.total:
            width = 30
            filled = min(width, int(width * done / self.total))
            bar = "#" * filled + "-" * (width - filled)
            text = f"{self.label} [{bar}] {done}/{self.total}"
        else:
            text = f"{self.label} {done}"
        elapsed = now - self._started
        line = f"\r{text} {detail} ({elapsed:.1f}s)"
        self.stream.write(line.ljust(79)[:200])
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self.enabled and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
