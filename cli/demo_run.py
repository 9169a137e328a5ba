"""``ibex demo``: the whole system on one machine, with the sample conversations.

Embedded Postgres and Redis when ``DATABASE_URL`` / ``REDIS_URL`` are unset (the ``embedded``
extra), migrations, a service token, the sample sessions of ``examples/``, the Procfile's
``web`` (the memory service under gunicorn) and ``worker`` (``dramatiq``) processes, one
scan, a progress bar until the backlog drains, then a summary and a few memories, and the read
path: a search and an assembled context for one sample agent, through the HTTP API with the
demo's token, as an application asks for them (:class:`~ibex_client.IbexClient`). Everything
it started is stopped on the way out, Ctrl-C included. Data stays under ``~/.ibex/demo``
(``--data-dir``), so a second run is fast; ``--fresh`` starts over.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.resources
import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cli.common import EXIT_FAILURE, EXIT_OK
from cli.progress import ProgressLine
from cli.stack.embedded import EmbeddedPostgres, EmbeddedRedis, default_demo_folder
from cli.stack.processes import ROOT, Launcher, ProcessError, free_port
from core.config import Settings, child_environment
from core.errors import ConfigError

#: The sample agent the read path is shown for, and what it is asked.
RECALL_ORG, RECALL_AGENT = "acme", "support-bot"
#: Whose memories the demo recalls: one person of the samples (each session is one person's).
RECALL_USER = "elena"
#: Sessions imported only once the others are extracted: a later conversation of one user
#: (ingrid moves and changes jobs), so its extraction sees the first one's memories as related
#: and supersedes them, as a conversation weeks later would.
LATER_SESSIONS = frozenset({"demo-037"})
CHANGE_ORG, CHANGE_AGENT, CHANGE_USER = "initech", "hr-helper", "ingrid"
RECALL_QUERY = "Is the user allergic to anything, and what do they love?"
RECALL_HITS, RECALL_TOKENS = 3, 120
#: One line under the hits: what their numbers mean.
SCORES_NOTE = (
    "scores are 0-1, higher is better: 0.75 x text (full-text match) + 0.25 x trigram"
    " (spelling similarity), plus a bonus for semantic (meaning) similarity; see"
    " docs/search.md"
)


@dataclass
class Summary:
    sessions: int
    turns: int
    memories: int
    llm_calls: int
    duplicate_slots: int
    duplicate_contents: int
    failed_turns: int
    seconds: float

    @property
    def llm_calls_per_turn(self) -> float:
        return self.llm_calls / self.turns if self.turns else 0.0

    def lines(self) -> list[str]:
        return [
            f"sessions extracted  {self.sessions}",
            f"turns extracted     {self.turns}",
            f"memories            {self.memories}",
            f"LLM calls           {self.llm_calls} ({self.llm_calls_per_turn:.2f} per turn)",
            f"duplicates          {self.duplicate_slots + self.duplicate_contents}",
            f"failed turns        {self.failed_turns}",
            f"wall time           {self.seconds:.1f}s",
        ]


def _examples_text() -> str:
    return (
        importlib.resources.files("examples")
        .joinpath("conversations.jsonl")
        .read_text(encoding="utf-8")
    )


@contextlib.contextmanager
def _stack(args: argparse.Namespace, settings: Settings) -> Iterator[dict[str, Any]]:
    folder = Path(args.data_dir).expanduser() if args.data_dir else default_demo_folder()
    if args.fresh and folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    postgres = EmbeddedPostgres(folder / "postgres")
    redis_server = EmbeddedRedis(folder / "redis")
    processes = Launcher(folder / "logs", cwd=ROOT)
    try:
        database_url = settings.database_url or postgres.start()
        redis_url = settings.redis_url if "REDIS_URL" in settings.explicit else redis_server.start()
        yield {
            "folder": folder,
            "database_url": database_url,
            "redis_url": redis_url,
            "processes": processes,
            "embedded": (settings.database_url is None, "REDIS_URL" not in settings.explicit),
        }
    finally:
        processes.stop(grace=15)
        redis_server.stop()
        postgres.stop()


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def run_demo(args: argparse.Namespace, settings: Settings) -> int:
    """The demo; SIGTERM stops it as cleanly as Ctrl-C (everything it started is stopped)."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _run_demo(args, settings)
    except ProcessError as exc:  # a process died or never answered: reported as before
        raise ConfigError(str(exc)) from exc
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_demo(args: argparse.Namespace, settings: Settings) -> int:
    from core.db import make_database
    from core.migrate import migrate
    from memories.tokens import TokenStore
    from models import bind
    from sessions.importer import import_lines
    from sessions.store import SessionStore

    started = time.monotonic()
    with _stack(args, settings) as stack:
        folder: Path = stack["folder"]
        pg_embedded, redis_embedded = stack["embedded"]
        print(f"data folder         {folder}")
        print(f"postgres            {'embedded' if pg_embedded else 'DATABASE_URL'}")
        print(f"redis               {'embedded' if redis_embedded else 'REDIS_URL'}")
        print(f"extractor           {settings.llm_provider}")
        migrate(stack["database_url"])
        db = bind(make_database(stack["database_url"]))
        store = SessionStore(db)
        lines = _examples_text().splitlines()
        later = [line for line in lines if json.loads(line)["session"] in LATER_SESSIONS]
        report = import_lines(store, [line for line in lines if line not in later])
        print(f"imported            {report.summary()}")
        print(f"                    {_explain_statuses(_statuses(db))}")

        _, token = TokenStore(db).issue(
            org_id=None, name="ibex demo", scopes=["memory:read", "memory:write"]
        )
        port = free_port()
        env = child_environment(
            {
                "DATABASE_URL": stack["database_url"],
                "REDIS_URL": stack["redis_url"],
                "MEMORY_SERVICE_URL": f"http://127.0.0.1:{port}",
                "MEMORY_SERVICE_TOKEN": token,
                "PORT": str(port),
                "WEB_CONCURRENCY": "2",
                "WORKER_PROCESSES": str(args.workers),
                "WORKER_THREADS": str(args.threads),
                "RETRY_MIN_BACKOFF_MS": "200",
                "RETRY_MAX_BACKOFF_MS": "5000",
                "PYTHONUNBUFFERED": "1",
            }
        )
        processes: Launcher = stack["processes"]
        logs = processes.folder
        logs.mkdir(exist_ok=True)
        # The Procfile's own web and worker lines, the web bound to loopback only.
        processes.start_procfile(
            "web", env, name="memory service", bind_host="127.0.0.1", log=logs / "web.log"
        )
        processes.wait_http(f"http://127.0.0.1:{port}/healthz")
        processes.start_procfile("worker", env, log=logs / "worker.log")
        done_before = _backlog(db)[0]
        _scan(env)
        drained = _wait_for_drain(db, processes, args.timeout)
        if drained and later:
            # The later conversation, once the first ones' memories are stored.
            print(f"later               {import_lines(store, later).summary()}")
            _scan(env)
            drained = _wait_for_drain(db, processes, args.timeout)
        summary = _summary(db, time.monotonic() - started)
        print()
        print(_totals_heading(folder, done_before, summary.turns))
        for line in summary.lines():
            print(line)
        print()
        _print_samples(db, total=summary.memories)
        print()
        _print_recall(db, f"http://127.0.0.1:{port}", token)
        print()
        _print_change(db, f"http://127.0.0.1:{port}", token)
        print()
        print(f"logs                {logs}")
        print()
        for line in WHAT_NEXT:
            print(line)
        if not drained:
            print(
                f"ibex demo: the backlog did not drain within {args.timeout:.0f}s", file=sys.stderr
            )
            return EXIT_FAILURE
    return EXIT_OK if summary.duplicate_slots + summary.duplicate_contents == 0 else EXIT_FAILURE


#: Printed last: where to go from the demo.
WHAT_NEXT = (
    "what next:",
    "  ibex up                  keep web, worker and scheduler up until Ctrl-C, with a token",
    "                           to try the API and the client (docs/cli.md: ibex up)",
    "  ibex demo --fresh        run the demo again from empty data",
    "  docs/search.md           how search ranks and what the scores mean",
)

#: What each status means for extraction, as the demo explains it.
STATUS_NOTES = {
    "completed": "completed (extracted)",
    "active": "active (still open: extracted once completed)",
    "abandoned": "abandoned (never extracted)",
}


def _statuses(db: Any) -> dict[str, int]:
    """Live sessions by status, across every org."""
    from core.db import operator_scope

    with operator_scope(db):
        rows = db.execute_sql(
            "SELECT status, count(*) FROM ibex_core.sessions WHERE deleted_at IS NULL"
            " GROUP BY status"
        ).fetchall()
    return {str(status): int(count) for status, count in rows}


def _explain_statuses(counts: dict[str, int]) -> str:
    """Why fewer sessions are extracted than imported: ``32 completed (extracted), 3 active
    (...), 1 abandoned (...)``."""
    order = [*STATUS_NOTES, *sorted(set(counts) - set(STATUS_NOTES))]
    parts = [
        f"{counts[status]} {STATUS_NOTES.get(status, status)}"
        for status in order
        if counts.get(status)
    ]
    return ", ".join(parts) if parts else "no sessions"


def _totals_heading(folder: Path, done_before: int, turns: int) -> str:
    """The line above the summary: whether its totals are this run's or cumulative."""
    if done_before == 0:
        return "totals of this run"
    return (
        f"totals in {folder}, cumulative over every run ({done_before} of the {turns} turns"
        " were extracted by earlier runs; --fresh starts over)"
    )


def _backlog(db: Any) -> tuple[int, int, int]:
    """(turns done, turns above every pointer, failed turns) across all orgs, as ``ibex status``
    counts them."""
    from extraction.status import collect

    total = collect(db, None, queues=[]).total
    return int(total["turns_done"]), int(total["pointer_lag"]), int(total["turns_failed"])


def _scan(env: dict[str, str]) -> None:
    """One ``ibex scan`` now, as the scheduler would run it; prints what it sent."""
    scan = subprocess.run(
        [sys.executable, "-m", "cli", "scan"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if scan.returncode != 0:
        raise ConfigError(f"the scan failed: {scan.stderr.strip() or scan.stdout.strip()}")
    print(f"scan                {scan.stdout.strip().splitlines()[-1] if scan.stdout else ''}")


def _wait_for_drain(db: Any, processes: Launcher, timeout: float) -> bool:
    done, lag, failed = _backlog(db)
    progress = ProgressLine("extracting", total=done + lag)
    deadline = time.monotonic() + timeout
    try:
        while lag > failed:
            if time.monotonic() > deadline:
                return False
            processes.check()
            progress.update(done, f"turns, {failed} failed")
            time.sleep(0.25)
            done, lag, failed = _backlog(db)
        progress.update(done, f"turns, {failed} failed", force=True)
    finally:
        progress.close()
    return True


def _summary(db: Any, seconds: float) -> Summary:
    from core.db import operator_scope

    with operator_scope(db):
        sessions, turns = db.execute_sql(
            "SELECT count(*) FILTER (WHERE last_extracted_turn = turn_count AND turn_count > 0),"
            " coalesce(sum(last_extracted_turn), 0) FROM ibex_core.sessions"
            " WHERE status = 'completed' AND deleted_at IS NULL"
        ).fetchone()
        memories = db.execute_sql(
            "SELECT count(*) FROM ibex_memory.memories WHERE deleted_at IS NULL"
        ).fetchone()[0]
        llm_calls, failed = db.execute_sql(
            "SELECT coalesce(sum(llm_calls), 0), count(*) FILTER (WHERE state = 'failed')"
            " FROM ibex_core.extraction_turns"
        ).fetchone()
        duplicate_slots = db.execute_sql(
            "SELECT count(*) FROM (SELECT 1 FROM ibex_memory.memories"
            " WHERE session_id IS NOT NULL GROUP BY org_id, session_id, turn_index, ordinal"
            " HAVING count(*) > 1) d"
        ).fetchone()[0]
        duplicate_contents = db.execute_sql(
            "SELECT count(*) FROM (SELECT 1 FROM ibex_memory.memories WHERE deleted_at IS NULL"
            # One live content per agent and user (two people may say the same thing).
            " GROUP BY org_id, agent_id, user_id, content_hash HAVING count(*) > 1) d"
        ).fetchone()[0]
    return Summary(
        int(sessions),
        int(turns),
        int(memories),
        int(llm_calls),
        int(duplicate_slots),
        int(duplicate_contents),
        int(failed),
        seconds,
    )


def _print_samples(db: Any, limit: int = 8, *, total: int | None = None) -> None:
    from core.db import operator_scope

    with operator_scope(db):
        rows = db.execute_sql(
            "SELECT o.slug, a.slug, m.kind, m.content FROM ibex_memory.memories m"
            " JOIN ibex_core.orgs o ON o.id = m.org_id"
            " JOIN ibex_core.agents a ON a.id = m.agent_id"
            " WHERE m.deleted_at IS NULL ORDER BY m.session_id, m.turn_index, m.ordinal"
            " LIMIT %s",
            (limit,),
        ).fetchall()
    if not rows:
        print("(no memories)")
        return
    if total is not None and total > len(rows):
        print(
            f"a sample: the first {len(rows)} of the {total} memories, in import order"
            " (all of them: ibex search, or GET /v1/memories)"
        )
    print(f"{'ORG':<9} {'AGENT':<17} {'KIND':<11} MEMORY")
    for org, agent, kind, content in rows:
        print(f"{org:<9} {agent:<17} {kind:<11} {content}")


def _print_recall(db: Any, url: str, token: str) -> None:
    """Search one sample agent's memories and assemble its context, over HTTP."""
    from core.db import operator_scope
    from ibex_client import IbexClient, IbexClientError

    with operator_scope(db):
        row = db.execute_sql(
            "SELECT o.id, a.id FROM ibex_core.orgs o JOIN ibex_core.agents a ON a.org_id = o.id"
            " WHERE o.slug = %s AND a.slug = %s",
            (RECALL_ORG, RECALL_AGENT),
        ).fetchone()
    name = f"{RECALL_ORG}/{RECALL_AGENT}, user {RECALL_USER}"
    if row is None:
        print(f"search              (no agent {name} in the samples)")
        return
    org_id, agent_id = row
    # The demo's token is a service token: it names the org it acts for.
    try:
        with IbexClient(url, token, org_id=org_id) as ibex:
            hits = ibex.search(RECALL_QUERY, agent_id=agent_id, limit=RECALL_HITS, user=RECALL_USER)
            context = ibex.context(
                agent_id, query=RECALL_QUERY, max_tokens=RECALL_TOKENS, user=RECALL_USER
            )
    except IbexClientError as exc:
        raise ConfigError(f"the search through the memory service failed: {exc}") from exc
    print(f"search              {name}: {RECALL_QUERY!r}")
    if not hits:
        print("(no matches)")
    for hit in hits:
        signals = f"text {hit.signals.text:.2f}, trigram {hit.signals.trigram:.2f}"
        if hit.signals.semantic is not None:
            signals += f", semantic {hit.signals.semantic:.2f}"
        print(f"  {hit.score:.2f}  {hit.memory.content}  ({signals})")
    if hits:
        print(SCORES_NOTE)
    print()
    print(
        f"context             {name}: {context.tokens} of {RECALL_TOKENS} tokens,"
        f" {len(context.memories)} memories, {context.dropped} dropped"
    )
    print(context.context or "(no memories matched)")


def _print_change(db: Any, url: str, token: str) -> None:
    """The facts of the later conversation that replaced earlier ones, with the memory each
    superseded (kept, never deleted: ``include_superseded`` and the history show both)."""
    from core.db import operator_scope
    from ibex_client import IbexClient, IbexClientError

    with operator_scope(db):
        row = db.execute_sql(
            "SELECT o.id, a.id FROM ibex_core.orgs o JOIN ibex_core.agents a ON a.org_id = o.id"
            " WHERE o.slug = %s AND a.slug = %s",
            (CHANGE_ORG, CHANGE_AGENT),
        ).fetchone()
    if row is None:
        return
    org_id, agent_id = row
    try:
        with IbexClient(url, token, org_id=org_id) as ibex:
            memories = list(
                ibex.iter_memories(agent_id=agent_id, user=CHANGE_USER, include_superseded=True)
            )
    except IbexClientError as exc:
        raise ConfigError(f"the listing through the memory service failed: {exc}") from exc
    by_id = {m.id: m for m in memories}
    changed = [
        (m, by_id[m.superseded_by])
        for m in sorted(memories, key=lambda m: m.created_at)
        if m.superseded_by is not None and m.superseded_by in by_id
    ]
    name = f"{CHANGE_ORG}/{CHANGE_AGENT}, user {CHANGE_USER}"
    print(f"facts that changed  {name}: {len(changed)} superseded by a later conversation")
    for old, new in changed:
        print(f"  {old.content}  ->  {new.content}")
    if changed:
        print(
            "                    (the old fact is kept, marked superseded: search and context"
            " return the current one; GET /v1/memories/{id}/history shows both)"
        )
