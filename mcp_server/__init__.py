"""The MCP server: the memory API as Model Context Protocol tools, for agents that attach
memory without code (coding agents, desktop assistants, agent frameworks).

Built on the official ``mcp`` SDK's high-level server (:class:`mcp.server.mcpserver.MCPServer`)
and talking to the memory service only through :mod:`ibex_client`, with the caller's own token,
so scopes, orgs and user-bound tokens hold exactly as over HTTP. Two transports: stdio
(``ibex mcp``, the token from ``IBEX_TOKEN``) and streamable HTTP (``ibex mcp --transport http``,
the Procfile's ``mcp`` process; the token from each request's ``Authorization: Bearer``).

- :mod:`mcp_server.config`: where the service is, who calls it by default, the limits;
- :mod:`mcp_server.tools`: the five tools and :func:`build_server`;
- :mod:`mcp_server.calls`: each call's token, agent and user, and ``remember``'s key;
- :mod:`mcp_server.answers`: what the tools answer, and errors as tool errors;
- :mod:`mcp_server.http`: the streamable HTTP app.

This package imports :mod:`ibex_client`, ``mcp`` and the standard library, nothing of the
server's own packages: it is a client of the web process like any application.
"""

from mcp_server.calls import remember_key
from mcp_server.config import TOOL_NAMES, McpConfig
from mcp_server.http import http_app
from mcp_server.tools import build_server

__all__ = ["TOOL_NAMES", "McpConfig", "build_server", "http_app", "remember_key"]
