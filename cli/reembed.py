"""``ibex reembed [--org SLUG] [--agent SLUG] [--batch-size N] [--all] [--json]``: embed the
live memories that lack a vector of the configured embedder's model (``EMBEDDINGS_*``), every
org unless ``--org``. After a model change every memory lacks one, so this is also how vectors
of a new model are made; ``--all`` replaces the current model's vectors too. Batches of
``--batch-size`` texts, one embedder request and one statement each, in id order: safe to
interrupt and to run again (it continues with what is still missing). Progress on stderr; the
totals on stdout (``--json``: one object). Where pgvector is installed it first creates the
HNSW index of the model's dimension, if missing (as the table's owner)."""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from typing import Any

from cli.common import EXIT_FAILURE, EXIT_OK, positive_int
from core.config import Settings
from schema.common import SLUG

DATABASE = True


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "reembed", help="embed memories lacking a vector of the configured embedding model"
    )
    p.add_argument("--org", metavar="SLUG", help="only this org (default: every org)")
    p.add_argument("--agent", metavar="SLUG", help="only this agent of --org")
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=100,
        metavar="N",
        help="memories per embedding request and statement (default 100)",
    )
    p.add_argument(
        "--all", action="store_true", help="also replace the vectors the model already has"
    )
    p.add_argument("--json", action="store_true", help="stable JSON output")


def _fail(message: str) -> int:
    print(f"ibex reembed: {message}", file=sys.stderr)
    return EXIT_FAILURE


def run(args: argparse.Namespace, settings: Settings) -> int:
    from cli.progress import Progress
    from core.db import make_database
    from core.errors import EmbeddingsUnavailable
    from embeddings import embedder_from_settings
    from memory_service.memories.service import BackfillReport, backfill
    from memory_service.memories.store import EmbeddingStore
    from memory_service.search.store import SearchStore

    if args.agent is not None and args.org is None:
        return _fail("--agent needs --org")
    for name in ("org", "agent"):
        value = getattr(args, name)
        if value is not None and not SLUG.match(value):
            return _fail(f"invalid {name} slug {value!r}")
    embedder = embedder_from_settings(settings)
    if embedder is None:
        return _fail("EMBEDDINGS_PROVIDER=none: no embedder to embed with")
    db = make_database(settings.require_database_url())
    started = time.monotonic()
    totals = BackfillReport()
    per_org: list[dict[str, Any]] = []
    try:
        embeddings = EmbeddingStore(db)
        embeddings.register(embedder.model, embedder.dimension)
        indexed = embeddings.ensure_index(embedder.dimension)
        orgs = _orgs(db, args.org)
        if orgs is None:
            return _fail(f"no org {args.org!r}")
        agent_id: uuid.UUID | None = None
        if args.agent is not None:
            agent_id = SearchStore(db).find_agent(orgs[0][0], args.agent)
            if agent_id is None:
                return _fail(f"no agent {args.agent!r} in org {args.org!r}")
        for org_id, slug in orgs:
            total = embeddings.count_missing(
                org_id, embedder.model, agent_id=agent_id, replace=args.all
            )
            progress = Progress(f"reembed {slug}", total=total)

            def on_batch(
                report: BackfillReport,
                slug: str = slug,
                total: int = total,
                progress: Progress = progress,
            ) -> None:
                progress.update(report.memories, f"{report.embedded} stored")
                if not progress.enabled:
                    print(
                        f"ibex reembed: {slug}: {report.memories}/{total} memories,"
                        f" {report.embedded} vectors stored",
                        file=sys.stderr,
                        flush=True,
                    )

            try:
                report = backfill(
                    embeddings,
                    embedder,
                    org_id,
                    agent_id=agent_id,
                    batch_size=args.batch_size,
                    replace=args.all,
                    on_batch=on_batch,
                )
            finally:
                progress.close()
            totals.memories += report.memories
            totals.embedded += report.embedded
            totals.requests += report.requests
            per_org.append({"org": slug, "memories": report.memories, "embedded": report.embedded})
    except EmbeddingsUnavailable as exc:
        return _fail(f"{exc}; what was stored stays, run it again to continue")
    finally:
        db.close()
    seconds = time.monotonic() - started
    if args.json:
        print(
            json.dumps(
                {
                    "model": embedder.model,
                    "dimension": embedder.dimension,
                    "vector_index": indexed,
                    "memories": totals.memories,
                    "embedded": totals.embedded,
                    "requests": totals.requests,
                    "orgs": per_org,
                    "seconds": round(seconds, 3),
                },
                sort_keys=True,
            )
        )
    else:
        print(
            f"embedded {totals.embedded} of {totals.memories} memories with {embedder.model}"
            f" ({embedder.dimension} dimensions) in {seconds:.1f}s,"
            f" {totals.requests} requests; search index: "
            + ("pgvector HNSW" if indexed else "exact cosine (no pgvector)")
        )
    return EXIT_OK


def _orgs(db: Any, slug: str | None) -> list[tuple[uuid.UUID, str]] | None:
    """The orgs to embed: the one named, or all; None when the named one does not exist."""
    from models.store import SessionStore

    if slug is not None:
        org_id = SessionStore(db, bind_models=False).find_org(slug)
        return [(org_id, slug)] if org_id is not None else None
    rows = db.execute_sql("SELECT id, slug FROM ibex_core.orgs ORDER BY slug").fetchall()
    return [(uuid.UUID(str(r[0])), r[1]) for r in rows]
