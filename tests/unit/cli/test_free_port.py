"""The ports ``ibex up`` and the benchmarks give their children: free, and never one an
outgoing connection can take before the child binds it."""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path

import pytest

from cli.stack import processes
from cli.stack.processes import PORTS_FROM, free_port


def test_a_free_port_is_below_the_ephemeral_range_and_bindable() -> None:
    low = processes._ephemeral_low()
    ports = {free_port() for _ in range(50)}
    assert all(PORTS_FROM <= p < low for p in ports)
    assert len(ports) > 1  # drawn at random, not one port for every child
    for port in list(ports)[:5]:
        with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_some_listener_holds_is_not_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    real = random.SystemRandom()
    draws: list[int] = []
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]

        class Draws:
            """The held port twice, then real draws (any port after it may be in use too)."""

            def randrange(self, start: int, stop: int) -> int:
                port = taken if len(draws) < 2 else real.randrange(start, stop)
                draws.append(port)
                return port

        monkeypatch.setattr(random, "SystemRandom", Draws)
        monkeypatch.setattr(processes, "_ephemeral_low", lambda: 65536)
        port = free_port()
    assert port != taken
    assert draws[:2] == [taken, taken] and len(draws) >= 3
    assert draws[-1] == port


def test_the_range_is_read_from_the_kernel_or_assumed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if real.exists():
        assert processes._ephemeral_low() == int(real.read_text().split()[0])
    monkeypatch.setattr(processes, "Path", lambda _: tmp_path / "absent")
    assert processes._ephemeral_low() == processes.EPHEMERAL_LOW
