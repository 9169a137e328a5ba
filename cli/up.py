"""``ibex up``: the whole stack on this machine for development, until Ctrl-C.

Postgres and Redis are the embedded servers of :mod:`cli.stack.embedded` (the ``embedded`` extra,
data under ``~/.ibex/up`` or ``--data-dir``) unless ``DATABASE_URL`` / ``REDIS_URL`` are set.
The migrations are applied; an org ``dev`` and two tokens are made on the first start (a
service token for the worker, with ``memory:write`` only, and an org token with every scope
for you) and kept in ``<data dir>/env`` (mode 0600) for the next starts; tokens an earlier
start made and the env file no longer holds are revoked. Everything under the data folder is
readable by its owner only. Then the Procfile's ``web``
(on ``--port``, loopback only), ``worker`` and ``scheduler`` lines run, with a short scan
period (``--scan-interval``, 2 s), each logging to ``<data dir>/logs/<process>.log``. The
worker's token is checked against the memory service (an authenticated write probe) before
the URL is printed. With ``--upstream URL`` (or ``UPSTREAM_LLM_BASE_URL`` set) the Procfile's
``proxy`` line runs too, on ``--proxy-port`` (``--port`` + 1), and its base URL and the headers
to send are printed; proxied sessions then close after ``UP_IDLE_SECONDS`` idle unless
``SESSION_IDLE_SECONDS`` is set. SIGINT or SIGTERM stops every process (SIGTERM to each
process group, SIGKILL after a grace period) and the embedded servers.

Guards (:mod:`cli.stack.supervisor`): the data folder is locked (a second start on it stops,
naming the pid that holds it), the ports are tried before anything starts, a service that
exits is restarted with backoff, and losing Postgres or Redis (and getting it back) is said on
the console.

``ibex up --check`` only checks ``MEMORY_SERVICE_TOKEN`` against ``MEMORY_SERVICE_URL``, as
the worker would use them, and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from cli.common import EXIT_FAILURE, EXIT_OK, positive_int
from core.config import Settings

#: ``ibex up`` brings its own databases when ``DATABASE_URL`` is unset, and migrates them.
DATABASE = False

#: The org the printed token belongs to.
DEV_ORG = "dev"
#: An org id no org has: the token probe names it, and its 422 writes nothing.
PROBE_ORG = "00000000-0000-0000-0000-000000000000"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("up", help="run web, worker and scheduler on this machine until Ctrl-C")
    p.add_argument("--port", type=positive_int, default=8000, help="memory service port (8000)")
    p.add_argument("--data-dir", help="where embedded servers and logs live (~/.ibex/up)")
    p.add_argument(
        "--scan-interval", type=positive_int, default=2, help="seconds between scans (2)"
    )
    p.add_argument("--workers", type=positive_int, default=1, help="worker processes (1)")
    p.add_argument("--threads", type=positive_int, default=4, help="threads per worker (4)")
    p.add_argument(
        "--upstream",
        metavar="URL",
        help="also run the chat path (the proxy), forwarding to this OpenAI-compatible URL"
        " (default: UPSTREAM_LLM_BASE_URL; unset: no proxy)",
    )
    p.add_argument("--proxy-port", type=positive_int, help="the chat path's port (--port + 1)")
    p.add_argument(
        "--check",
        action="store_true",
        help="only check MEMORY_SERVICE_TOKEN against MEMORY_SERVICE_URL, then exit",
    )


def default_folder() -> Path:
    return Path(os.path.expanduser("~")) / ".ibex" / "up"


def check_token(url: str, token: str, timeout: float = 5.0) -> tuple[bool, str]:
    """Whether the memory service at ``url`` takes ``token`` for a memory write, and one line
    saying so. The probe is a ``POST /v1/memories`` of an empty document for an org no org
    has: a known token with ``memory:write`` gets 422 and nothing is written."""
    import httpx

    try:
        response = httpx.post(
            f"{url.rstrip('/')}/v1/memories",
            json={},
            headers={"Authorization": f"Bearer {token}", "X-IBEX-Org-ID": PROBE_ORG},
            timeout=timeout,
        )
    except httpx.HTTPError as exc:
        return False, f"no memory service answers at {url} ({type(exc).__name__})"
    if response.status_code == 422:
        return True, f"the memory service at {url} accepts the worker's token"
    code = ""
    with contextlib.suppress(ValueError):
        code = str(response.json().get("error", {}).get("code", ""))
    if response.status_code == 401:
        return False, f"the memory service at {url} does not know this token (unknown or revoked)"
    if response.status_code == 403 and code == "FORBIDDEN_ORG":
        return False, (
            "the token is not a service token: it belongs to one org, and the worker writes"
            " for every org (ibex token create --service --scope memory:write)"
        )
    if response.status_code == 403:
        return False, f"the token lacks the memory:write scope ({code or 403})"
    if response.status_code == 400 and code == "ORG_REQUIRED":
        return False, "the token is not a service token (ibex token create --service)"
    return False, f"unexpected answer from {url}: {response.status_code} {code}".rstrip()


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.check:
        if not settings.memory_service_token:
            print("ibex up --check: MEMORY_SERVICE_TOKEN is not set", file=sys.stderr)
            return EXIT_FAILURE
        ok, line = check_token(settings.memory_service_url, settings.memory_service_token)
        print(f"ibex up --check: {line}", file=sys.stdout if ok else sys.stderr)
        return EXIT_OK if ok else EXIT_FAILURE
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _up(args, settings)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _up(args: argparse.Namespace, settings: Settings) -> int:
    from cli.stack.embedded import EmbeddedPostgres, EmbeddedRedis
    from cli.stack.processes import ROOT, Launcher, ProcessError
    from cli.stack.supervisor import (
        Supervisor,
        Watch,
        check_ports,
        hold_folder,
        postgres_probe,
        redis_probe,
    )
    from core.config import child_environment
    from core.db import make_database
    from core.errors import ConfigError
    from core.migrate import migrate
    from memories.tokens import TokenStore
    from sessions.store import SessionStore

    folder = Path(args.data_dir).expanduser() if args.data_dir else default_folder()
    upstream = (args.upstream or settings.upstream_llm_base_url or "").rstrip("/") or None
    proxy_port = args.proxy_port or args.port + 1
    # Everything under the data folder (the databases, Redis' files, the logs, the env file
    # with its tokens) is readable by its owner only: this process and every child it starts
    # create their files under this mask.
    os.umask(0o077)
    folder.mkdir(parents=True, exist_ok=True)
    # Before anything else: a second start on this folder would rewrite its env file.
    lock = hold_folder(folder)
    ports = {"the memory service, --port": args.port}
    if upstream:
        ports["the chat path, --proxy-port"] = proxy_port
    check_ports(ports)
    _owner_only(folder)
    postgres = EmbeddedPostgres(folder / "postgres")
    redis_server = EmbeddedRedis(folder / "redis")
    logs = folder / "logs"
    processes = Launcher(logs, cwd=ROOT)
    try:
        database_url = settings.database_url or postgres.start()
        redis_url = settings.redis_url if "REDIS_URL" in settings.explicit else redis_server.start()
        print(f"data folder   {folder}", flush=True)
        print(f"postgres      {'DATABASE_URL' if settings.database_url else 'embedded'}")
        print(f"redis         {'REDIS_URL' if 'REDIS_URL' in settings.explicit else 'embedded'}")
        print(f"extractor     {settings.llm_provider}", flush=True)
        migrate(database_url)
        db = make_database(database_url)
        try:
            worker_token, user_token = _tokens(TokenStore(db), _read_env(folder))
            sessions = SessionStore(db)
            sessions.ensure_agent(sessions.ensure_org(DEV_ORG), DEV_AGENT)
        finally:
            db.close()
        url = f"http://127.0.0.1:{args.port}"
        overrides = {
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "MEMORY_SERVICE_URL": url,
            "MEMORY_SERVICE_TOKEN": worker_token,
            "PORT": str(args.port),
            "WEB_CONCURRENCY": os.environ.get("WEB_CONCURRENCY") or "2",
            "WORKER_PROCESSES": str(args.workers),
            "WORKER_THREADS": str(args.threads),
            "SCAN_INTERVAL_SECONDS": str(args.scan_interval),
            "PYTHONUNBUFFERED": "1",
        }
        if upstream:
            overrides["UPSTREAM_LLM_BASE_URL"] = upstream
            if "SESSION_IDLE_SECONDS" not in settings.explicit:
                # A proxied conversation has no end but the idle close (or the end header):
                # short here, so a developer sees its memories within minutes.
                overrides["SESSION_IDLE_SECONDS"] = str(UP_IDLE_SECONDS)
        env = child_environment(overrides)
        logs.mkdir(parents=True, exist_ok=True)

        def bury(process: Any) -> None:
            # What is left of an exited service's group (gunicorn's workers after their
            # master was killed) would hold its port against the restart.
            process.signal(signal.SIGKILL)
            processes.forget(process)

        supervisor = Supervisor(say=_say, forget=bury)

        def start(kind: str, port: int | None = None, **kw: Any) -> Any:
            def again() -> Any:
                child_env = env if port is None else {**env, "PORT": str(port)}
                return processes.start_procfile(kind, child_env, log=logs / f"{kind}.log", **kw)

            return again

        web = start("web", name="memory service", bind_host="127.0.0.1")
        supervisor.watch(web(), web)
        processes.wait_http(f"{url}/healthz", timeout=60)
        ok, line = check_token(url, worker_token)
        print(f"worker token  {line}", flush=True)
        if not ok:
            raise ConfigError(f"the worker's token was refused: {line}")
        for kind in ("worker", "scheduler"):
            again = start(kind)
            supervisor.watch(again(), again)
        proxy_url = None
        if upstream:
            proxy = start("proxy", proxy_port, name="chat path", bind_host="127.0.0.1")
            supervisor.watch(proxy(), proxy)
            processes.wait_http(f"http://127.0.0.1:{proxy_port}/healthz", timeout=60)
            proxy_url = f"http://127.0.0.1:{proxy_port}/v1"
        _write_env(folder, database_url, redis_url, url, user_token, worker_token, proxy_url)
        print(f"logs          {logs}")
        print(f"scan period   {args.scan_interval}s")
        print(f"url           {url}")
        print(f"token         {user_token}  (org {DEV_ORG}, every scope; kept in {folder / 'env'})")
        if proxy_url:
            _print_chat_path(proxy_url, upstream or "", user_token)
        print()
        _print_next(folder, ROOT)
        print("ibex up: running; Ctrl-C stops everything", flush=True)
        watches = [
            Watch("Postgres", postgres_probe(database_url), lost=LOST_POSTGRES, say=_say),
            Watch("Redis", redis_probe(redis_url), lost=LOST_REDIS, say=_say),
        ]
        while True:
            supervisor.poll()
            for watch in watches:
                watch.poll()
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("\nibex up: stopping", flush=True)
        return EXIT_OK
    except ProcessError as exc:
        raise ConfigError(f"{exc}; see the logs in {logs}") from exc
    finally:
        processes.stop(grace=15)
        redis_server.stop()
        postgres.stop()
        lock.close()
        print("ibex up: stopped", flush=True)


#: The agent ``ibex up`` makes in its org, the one the printed lines and the README name.
DEV_AGENT = "support-bot"
#: The demo person of the printed lines (the example's user).
DEV_USER = "dana"
#: ``SESSION_IDLE_SECONDS`` under ``ibex up --upstream`` (unless set): proxied sessions close
#: after two quiet minutes.
UP_IDLE_SECONDS = 120
LOST_POSTGRES = "the memory service answers 503 and extraction stops"
LOST_REDIS = "extraction stops (the web process's /readyz says unavailable)"


def _say(line: str) -> None:
    print(line, flush=True)


def _print_chat_path(proxy_url: str, upstream: str, token: str) -> None:
    """The chat path's base URL and the headers to send, ready for the OpenAI SDK."""
    headers = {
        "X-IBEX-Token": token,
        "X-IBEX-Agent": DEV_AGENT,
        "X-IBEX-User": DEV_USER,
        "X-IBEX-Memory": "inject",
    }
    print(f"chat path     {proxy_url}  (OpenAI-compatible, forwards to {upstream})")
    print(f"headers       {json.dumps(headers)}")
    print("              and per conversation X-IBEX-Session-ID: <its id>;")
    print("              on its last call X-IBEX-Session-End: true (else it closes idle)")
    print("  from openai import OpenAI")
    print(f'  llm = OpenAI(base_url="{proxy_url}", api_key="<your upstream key>",')
    print(f"               default_headers={json.dumps(headers)})")


def _print_next(folder: Path, root: Path) -> None:
    """The lines to try next, as they run in a new terminal."""
    print("try next, in another terminal:")
    if sys.prefix != sys.base_prefix:
        print(f"  . {Path(sys.prefix) / 'bin' / 'activate'}   # the virtualenv of this ibex")
    print(f"  cd {root}")
    print(f"  set -a; . {folder / 'env'}; set +a   # the CLI's and the example's settings")
    print('  python examples/chat_with_memory.py "$IBEX_URL" <<< "$IBEX_TOKEN"')
    print(
        f"  ibex search 'what is Dana allergic to?' --org {DEV_ORG} --agent {DEV_AGENT}"
        f" --user {DEV_USER}"
    )
    print()


#: The names of the tokens ``ibex up`` makes: a start keeps the ones its env file holds and
#: revokes every other token of these names (the ones earlier starts made).
WORKER_TOKEN_NAME = "ibex up worker"  # noqa: S105 (a name, not a secret)
USER_TOKEN_NAME = "ibex up"  # noqa: S105
#: The worker writes memories for any org, and does nothing else.
WORKER_SCOPES = ("memory:write",)
#: The env file's line that keeps the worker's token across starts.
WORKER_TOKEN_VARIABLE = "IBEX_WORKER_TOKEN"  # noqa: S105


def _tokens(tokens: Any, kept: dict[str, str]) -> tuple[str, str]:
    """The worker's service token and the developer's org token: the ones the env file of an
    earlier start holds while they are still valid, else new ones; every other token an
    ``ibex up`` made is revoked, so restarts do not pile tokens up."""
    from memories.tokens import hash_token
    from schema.memory import SCOPES

    org_id = tokens.ensure_org(DEV_ORG)
    wanted = {
        WORKER_TOKEN_NAME: (None, WORKER_SCOPES, kept.get(WORKER_TOKEN_VARIABLE)),
        USER_TOKEN_NAME: (org_id, tuple(SCOPES), kept.get("IBEX_TOKEN")),
    }
    chosen: dict[str, str] = {}
    keep_ids: set[Any] = set()
    for name, (org, scopes, secret) in wanted.items():
        row = tokens.lookup(hash_token(secret)) if secret else None
        if (
            row is not None
            and row.revoked_at is None
            and row.name == name
            and row.org_id == org
            and set(row.scopes) == set(scopes)
        ):
            assert secret is not None
            chosen[name], keep_ids = secret, keep_ids | {row.id}
            continue
        row, chosen[name] = tokens.issue(org_id=org, name=name, scopes=list(scopes))
        keep_ids.add(row.id)
    for row in tokens.list():
        if row.name in wanted and row.revoked_at is None and row.id not in keep_ids:
            tokens.revoke(row.id)
    return chosen[WORKER_TOKEN_NAME], chosen[USER_TOKEN_NAME]


def _owner_only(folder: Path) -> None:
    """The data folder and what an earlier start left in it: readable by the owner only."""
    folder.chmod(0o700)
    for path in folder.rglob("*"):
        if path.is_symlink():
            continue
        with contextlib.suppress(OSError):
            path.chmod(0o700 if path.is_dir() else path.stat().st_mode & 0o700)


def _read_env(folder: Path) -> dict[str, str]:
    """The variables of an earlier start's ``<folder>/env`` (none when there is none)."""
    try:
        text = (folder / "env").read_text(encoding="utf-8")
    except OSError:
        return {}
    pairs = (line.partition("=") for line in text.splitlines())
    return {k.strip(): v.strip() for k, sep, v in pairs if sep and k.strip()}


def _write_env(
    folder: Path,
    database_url: str,
    redis_url: str,
    url: str,
    token: str,
    worker_token: str,
    proxy_url: str | None = None,
) -> None:
    """``<folder>/env``: the variables the CLI and the example need (and the worker's token,
    kept for the next start; the chat path's base URL when it runs), readable by you only."""
    path = folder / "env"
    text = (
        f"DATABASE_URL={database_url}\nREDIS_URL={redis_url}\nIBEX_URL={url}\nIBEX_TOKEN={token}\n"
        f"{WORKER_TOKEN_VARIABLE}={worker_token}\n"
    )
    if proxy_url:
        text += f"IBEX_PROXY_URL={proxy_url}\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
