"""What a command started from a terminal has, for the tests that start one and press Ctrl-C."""

from __future__ import annotations

import signal


def default_sigint() -> None:
    """``preexec_fn`` of a command the test stops with SIGINT, as Ctrl-C would: a shell starts
    background jobs with SIGINT ignored (a test run started with ``&``, and every process it
    starts, inherits that), and Python keeps an ignored SIGINT; a person at a terminal has the
    default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
