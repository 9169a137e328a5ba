"""``ibex up``'s supervisor without processes: the restart backoff and the server watch (the
folder lock and the port check: tests/integration/operations/test_up_guards.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cli.stack.supervisor import Supervisor, Watch


@dataclass
class FakeProcess:
    name: str
    log: Path = Path("/logs/x.log")
    running: bool = True
    code: int | None = None

    def alive(self) -> bool:
        return self.running

    @property
    def returncode(self) -> int | None:
        return self.code

    def die(self, code: int = -9) -> None:
        self.running, self.code = False, code


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Console:
    lines: list[str] = field(default_factory=list)

    def __call__(self, line: str) -> None:
        self.lines.append(line)


def test_an_exited_service_is_restarted_with_growing_then_reset_backoff() -> None:
    clock, said, forgotten = Clock(), Console(), []
    started: list[FakeProcess] = []

    def start() -> FakeProcess:
        started.append(FakeProcess("web"))
        return started[-1]

    supervisor = Supervisor(say=said, forget=forgotten.append, clock=clock, stable=60)
    supervisor.watch(start(), start)
    supervisor.poll()
    assert said.lines == []

    delays = []
    for _ in range(7):
        started[-1].die()
        supervisor.poll()  # the exit is seen: restart scheduled
        line = said.lines[-1]
        assert "the web process exited with status -9" in line and "/logs/x.log" in line
        delays.append(float(line.split("restarting in ")[1].split("s")[0]))
        count = len(started)
        clock.now += delays[-1] - 0.01
        supervisor.poll()
        assert len(started) == count  # not yet
        clock.now += 0.01
        supervisor.poll()
        assert len(started) == count + 1 and said.lines[-1] == "ibex up: the web process restarted"
    assert delays == [1, 2, 4, 8, 16, 30, 30]
    assert len(forgotten) == 7

    # A minute of running since the last start: the next crash is a first one again.
    clock.now += 61
    supervisor.poll()
    started[-1].die(1)
    supervisor.poll()
    assert "exited with status 1; restarting in 1s" in said.lines[-1]


def test_a_lost_server_and_its_return_are_each_said_once() -> None:
    clock, said = Clock(), Console()
    up = [True]
    watch = Watch("Redis", lambda: up[0], lost="extraction stops", say=said, clock=clock, every=2)
    watch.poll()
    up[0] = False
    clock.now = 1
    watch.poll()
    assert said.lines == []  # not probed again before `every` seconds
    for t in (2, 4, 6):
        clock.now = t
        watch.poll()
    assert said.lines == ["ibex up: lost Redis: extraction stops; waiting for it to come back"]
    up[0] = True
    clock.now = 8
    watch.poll()
    clock.now = 10
    watch.poll()
    assert said.lines[1:] == ["ibex up: Redis is back"]
