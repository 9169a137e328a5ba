"""The Procfile reader: lines to argv, with the shell's variable expansion done from a given
environment, and the repository's own Procfile read the same way."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.stack.processes import PROCFILE, Procfile, expand, rebind, resolve
from core.canonical import canonical_json
from core.errors import ConfigError

TEXT = """\
# comment
release: ibex migrate

web: gunicorn --bind 0.0.0.0:$PORT --workers ${WEB_CONCURRENCY:-4} --threads ${WEB_THREADS:-2} app
worker: dramatiq actors --processes ${WORKER_PROCESSES:-2} --threads ${WORKER_THREADS}
"""


def test_lines_are_read_by_name_comments_and_blank_lines_skipped() -> None:
    procfile = Procfile.parse(TEXT)
    assert set(procfile.commands) == {"release", "web", "worker"}
    assert procfile.command("release") == "ibex migrate"


def test_defaults_apply_when_a_variable_is_unset_or_empty() -> None:
    procfile = Procfile.parse(TEXT)
    argv = procfile.argv("web", {"PORT": "8080", "WEB_THREADS": ""})
    assert argv == [
        "gunicorn", "--bind", "0.0.0.0:8080", "--workers", "4", "--threads", "2", "app",
    ]  # fmt: skip


def test_values_from_the_environment_win_over_defaults() -> None:
    env = {"WORKER_PROCESSES": "3", "WORKER_THREADS": "5"}
    argv = Procfile.parse(TEXT).argv("worker", env)
    assert argv == ["dramatiq", "actors", "--processes", "3", "--threads", "5"]


def test_an_unset_variable_without_default_is_named() -> None:
    with pytest.raises(ConfigError) as caught:
        Procfile.parse(TEXT).argv("web", {})
    assert caught.value.variable == "PORT"
    # Set but empty is the shell's empty string, not an error.
    assert expand("a${X}b$X", {"X": ""}) == "ab"


def test_expansion_forms() -> None:
    env = {"A": "1", "B_2": "two words"}
    assert expand("$A ${A} ${A:-9} ${NOPE:-d e} x${B_2}y", env) == "1 1 1 d e xtwo wordsy"
    assert expand("no variables: 100%", {}) == "no variables: 100%"


def test_a_malformed_or_repeated_line_and_an_unknown_process_are_errors() -> None:
    with pytest.raises(ConfigError, match="line 1"):
        Procfile.parse("just a command\n")
    with pytest.raises(ConfigError, match="repeats 'web'"):
        Procfile.parse("web: a\nweb: b\n")
    with pytest.raises(ConfigError, match="no 'clock' process"):
        Procfile.parse(TEXT).command("clock")
    with pytest.raises(ConfigError, match="cannot read the Procfile"):
        Procfile.read(Path("/nonexistent/Procfile"))


def test_rebind_replaces_the_host_and_keeps_the_port() -> None:
    argv = ["gunicorn", "--bind", "0.0.0.0:8080", "app"]
    assert rebind(argv, "127.0.0.1") == ["gunicorn", "--bind", "127.0.0.1:8080", "app"]
    assert rebind(["g", "--bind=[::]:81"], "127.0.0.1") == ["g", "--bind=127.0.0.1:81"]
    uvicorn = ["uvicorn", "--host", "0.0.0.0", "--port", "1"]  # noqa: S104
    assert rebind(uvicorn, "127.0.0.1") == [
        "uvicorn",
        "--host",
        "127.0.0.1",
        "--port",
        "1",
    ]
    with pytest.raises(ConfigError, match="no --bind"):
        rebind(["dramatiq", "actors"], "127.0.0.1")


def test_the_repository_procfile_runs_the_documented_commands() -> None:
    procfile = Procfile.read()
    assert procfile.path == PROCFILE
    assert set(procfile.commands) == {"release", "web", "worker", "scheduler", "proxy", "mcp"}
    web = procfile.argv("web", {"PORT": "9000"}, bind_host="127.0.0.1")
    assert web[:3] == ["gunicorn", "--bind", "127.0.0.1:9000"]
    assert web[web.index("--worker-class") + 1] == (
        "memory_service.gunicorn_worker.BufferingThreadWorker"
    )
    assert web[-1] == "memory_service.wsgi:application"
    assert procfile.argv("worker", {})[:2] == ["dramatiq", "actors"]
    assert procfile.argv("scheduler", {}) == ["ibex", "scheduler"]
    assert procfile.argv("release", {}) == ["ibex", "migrate"]
    proxy = procfile.argv("proxy", {"PORT": "9001"})
    assert proxy[:3] == ["uvicorn", "--factory", "proxy.asgi:application"]
    assert proxy[proxy.index("--port") + 1] == "9001"
    assert procfile.argv("mcp", {"PORT": "9001"}, bind_host="127.0.0.1") == [
        "ibex", "mcp", "--transport", "http", "--bind", "127.0.0.1:9001"
    ]  # fmt: skip


def test_programs_resolve_beside_the_interpreter_first(tmp_path: Path) -> None:
    # gunicorn is installed in this interpreter's environment; an empty PATH does not hide it.
    assert Path(resolve("gunicorn", {"PATH": str(tmp_path)})).parent.is_dir()
    with pytest.raises(ConfigError, match="not installed"):
        resolve("no-such-program-ibex", {"PATH": str(tmp_path)})
    assert resolve("/bin/sh", {}) == "/bin/sh"


def test_canonical_json_sorts_compacts_and_keeps_utf8() -> None:
    assert canonical_json({"b": [1, {"d": 1, "c": "é"}], "a": None}) == (
        '{"a":null,"b":[1,{"c":"é","d":1}]}'
    )
    with pytest.raises(TypeError):
        canonical_json({"x": object()})
    assert canonical_json({"x": Path("/p")}, default=str) == '{"x":"/p"}'
