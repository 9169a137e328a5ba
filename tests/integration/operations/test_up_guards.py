"""``ibex up``'s folder lock and port check against the real kernel: a lock held by another
process is named with its pid and dropped when that process dies; a port something listens on
is named before anything starts."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cli.stack.supervisor import check_ports, hold_folder, port_in_use
from core.errors import ConfigError

pytestmark = pytest.mark.integration


def test_the_folder_lock_names_its_holder_and_is_released_when_it_dies(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path;"
            "from cli.stack.supervisor import hold_folder;"
            f"h = hold_folder(Path({str(tmp_path)!r})); print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[3],
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        with pytest.raises(ConfigError, match=rf"in use by another ibex up \(pid {holder.pid}\)"):
            hold_folder(tmp_path)
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    handle = hold_folder(tmp_path)  # the kernel dropped the dead holder's lock
    assert (tmp_path / "lock").read_text() == f"{os.getpid()}\n"
    handle.close()


def test_a_port_in_use_is_named() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert port_in_use(port)
        with pytest.raises(ConfigError, match=rf"port {port} \(the chat path\) is in use"):
            check_ports({"the chat path": port})
    assert not port_in_use(port)
