"""``ibex mcp [--transport stdio|http] [--bind HOST:PORT]``: the MCP server (:mod:`mcp_server`).

stdio (the default) is what a desktop assistant or an editor spawns: ``IBEX_URL`` (the web
process), ``IBEX_TOKEN``, ``IBEX_AGENT`` (slug or id) and optionally ``IBEX_USER`` come from its
environment, and stdout carries the protocol only. ``--transport http`` serves streamable HTTP
at ``/mcp`` (the Procfile's ``mcp`` process, on ``$PORT``); each request's bearer token is the
caller's, ``IBEX_TOKEN`` is not used. Neither touches the database: every call goes to the web
process through the client.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from cli.common import EXIT_FAILURE, EXIT_OK
from core.config import Settings

DATABASE = False


def _bind(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not sep or not host or not 0 < number < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, not {value!r}")
    return host, number


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "mcp", help="serve the memories to agents over the Model Context Protocol (stdio or HTTP)"
    )
    p.add_argument(
        "--transport",
        choices=("stdio", "http"),
        default="stdio",
        help="stdio (default: spawned by the agent's app) or streamable HTTP",
    )
    p.add_argument(
        "--bind",
        type=_bind,
        metavar="HOST:PORT",
        help="where --transport http listens (default 127.0.0.1:$PORT, else 8000)",
    )


def run(args: argparse.Namespace, settings: Settings) -> int:
    from mcp_server import McpConfig, build_server, http_app

    config = McpConfig.from_env()
    if args.transport == "stdio":
        if not config.token:
            print(
                "ibex mcp: IBEX_TOKEN is not set (the token the agent acts with)", file=sys.stderr
            )
            return EXIT_FAILURE
        build_server(config).run("stdio")
        return EXIT_OK

    import uvicorn

    host, port = args.bind or ("127.0.0.1", int(os.environ.get("PORT") or 8000))
    uvicorn.run(http_app(config, host=host), host=host, port=port, log_level="warning")
    return EXIT_OK
