"""The five tools (``remember``, ``recall``, ``context``, ``forget``, ``list_memories``), each a
method of :class:`MemoryTools`, published by :func:`build_server`.

The service decides what the caller's token may do; a refusal comes back as a tool error
carrying the API's code and message (``FORBIDDEN: ...``), never as a crashed server. Arguments
are typed (the SDK validates them against the schema it publishes), and a value the service
rejects field by field names the field.

``remember`` stores a memory with no source (a memory an agent states is not extracted from a
session turn) under an idempotency key derived from the call's arguments and scope (token,
agent, user, content, kind), so the same call repeated after a lost answer stores one memory;
content the agent already has answers the memory that holds it; content remembered, forgotten
and remembered again is stored again (:func:`~mcp_server.calls.next_remember_key`).
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from ibex_client import ApiError, DuplicateContentError, NotFoundError
from mcp_server.answers import (
    ForgottenOut,
    MemoryPage,
    PackedContext,
    Recalled,
    Remembered,
    hit_out,
    memory_out,
)
from mcp_server.calls import (
    MAX_REMEMBER_GENERATIONS,
    Calls,
    next_remember_key,
    remember_key,
)
from mcp_server.config import MAX_CONTENT, MAX_PAGE, MAX_RECALL, Kind, McpConfig

AgentArg = Annotated[
    str | None,
    Field(description="The agent (its id or slug); default IBEX_AGENT.", max_length=200),
]
UserArg = Annotated[
    str | None,
    Field(
        description="Whose memory (the application's key for the person); default IBEX_USER."
        " A user-bound token is always its own user.",
        max_length=200,
    ),
]

#: What each tool may do, as MCP annotates it.
READS = ToolAnnotations(read_only_hint=True, open_world_hint=False)
WRITES = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True)
DELETES = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True)


class MemoryTools:
    """The tools, each one method: its arguments and docstring are what the SDK publishes."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls

    async def remember(
        self,
        content: Annotated[
            str,
            Field(
                description="The memory, one self-contained statement.",
                min_length=1,
                max_length=MAX_CONTENT,
            ),
        ],
        ctx: Context,
        kind: Annotated[Kind, Field(description="What sort of memory it is.")] = "fact",
        agent: AgentArg = None,
        user: UserArg = None,
    ) -> Remembered:
        """Store a long-term memory for the agent (and the user, if any). Safe to repeat: the
        same call again returns the same memory, and content the agent already has returns
        the memory that holds it."""
        token = self.calls.token(ctx)
        who = self.calls.user(user)
        async with self.calls.client(token) as ibex:
            agent_id = await self.calls.run(lambda: self.calls.agent_id(ibex, token, agent))
            assert agent_id is not None
            first_key = remember_key(token, agent_id, who, content, kind)

            async def store() -> Remembered:
                key = first_key
                try:
                    for _ in range(MAX_REMEMBER_GENERATIONS):
                        stored = await ibex.create_memory(
                            agent_id, content, kind=kind, idempotency_key=key, user=who
                        )
                        if not stored.replayed:
                            return Remembered(memory=memory_out(stored), already_known=False)
                        # A replay names the memory an earlier call stored: known, unless it
                        # was forgotten since. Then the content is stored again under the next
                        # key of the chain (derived from the forgotten memory, so a retry of
                        # this call lands on the same new memory).
                        try:
                            current = await ibex.get_memory(stored.id, user=who)
                        except NotFoundError:
                            key = next_remember_key(key, stored.id)
                            continue
                        except ApiError:  # e.g. a token without memory:read: cannot tell
                            current = stored
                        return Remembered(memory=memory_out(current), already_known=True)
                    raise ToolError(
                        "this content was remembered and forgotten too many times; give it"
                        " other words"
                    )
                except DuplicateContentError as exc:
                    if exc.existing_id is None:
                        raise
                    try:
                        known = await ibex.get_memory(exc.existing_id, user=who)
                    except ApiError as hidden:  # e.g. a token without memory:read
                        raise ToolError(
                            f"DUPLICATE_CONTENT: the agent already has this content, as memory"
                            f" {exc.existing_id} ({hidden.code or hidden.status} reading it)"
                        ) from None
                    return Remembered(memory=memory_out(known), already_known=True)
                return Remembered(memory=memory_out(stored), already_known=False)

            return await self.calls.run(store)

    async def recall(
        self,
        query: Annotated[str, Field(description="What to look for: a question, a name, words.")],
        ctx: Context,
        limit: Annotated[
            int, Field(description=f"Hits at most (1-{MAX_RECALL}).", ge=1, le=MAX_RECALL)
        ] = 10,
        agent: AgentArg = None,
        user: UserArg = None,
    ) -> Recalled:
        """Search the agent's memories, best first, each with why it matched: the fused score,
        the per-signal scores (full text, trigram, recency, meaning) and a highlighted
        snippet."""
        token = self.calls.token(ctx)
        who = self.calls.user(user)
        async with self.calls.client(token) as ibex:
            agent_id = await self.calls.run(lambda: self.calls.agent_id(ibex, token, agent))
            assert agent_id is not None
            hits = await self.calls.run(
                lambda: ibex.search(query, agent_id=agent_id, limit=limit, user=who)
            )
        return Recalled(hits=[hit_out(h) for h in hits])

    async def context(
        self,
        query: Annotated[str, Field(description="What the agent is about to answer.")],
        ctx: Context,
        max_tokens: Annotated[
            int, Field(description="Budget of the block in estimated tokens.", ge=1)
        ] = 400,
        agent: AgentArg = None,
        user: UserArg = None,
    ) -> PackedContext:
        """The person's standing facts (allergies, who they are, where they live, their
        people; all of their memories when they fit), then the memories relevant to the query,
        packed into a token budget as a <memories> block ready to put into a system prompt."""
        token = self.calls.token(ctx)
        who = self.calls.user(user)
        async with self.calls.client(token) as ibex:
            agent_id = await self.calls.run(lambda: self.calls.agent_id(ibex, token, agent))
            assert agent_id is not None
            packed = await self.calls.run(
                lambda: ibex.context(agent_id, query=query, max_tokens=max_tokens, user=who)
            )
        return PackedContext(
            context=packed.context,
            memories=[hit_out(h) for h in packed.memories],
            tokens=packed.tokens,
            dropped=packed.dropped,
        )

    async def forget(
        self,
        memory_id: Annotated[uuid.UUID, Field(description="The id of the memory to forget.")],
        ctx: Context,
        user: UserArg = None,
    ) -> ForgottenOut:
        """Forget one memory (a soft delete: it is never recalled again). A memory this token
        cannot see (another org's, another user's, or already forgotten) is NOT_FOUND."""
        token = self.calls.token(ctx)
        who = self.calls.user(user)
        async with self.calls.client(token) as ibex:
            # The delete reaches what the token reads for that user (delete follows read).
            deleted = await self.calls.run(lambda: ibex.delete_memory(memory_id, user=who))
        if not deleted:
            raise ToolError(f"NOT_FOUND: no memory {memory_id} (or it is already forgotten)")
        return ForgottenOut(memory_id=str(memory_id), forgotten=True)

    async def list_memories(
        self,
        ctx: Context,
        cursor: Annotated[
            str | None, Field(description="next_cursor of the previous page; none for the first.")
        ] = None,
        limit: Annotated[
            int | None,
            Field(description=f"Memories per page (1-{MAX_PAGE}, default 50).", ge=1, le=MAX_PAGE),
        ] = None,
        agent: AgentArg = None,
        user: UserArg = None,
    ) -> MemoryPage:
        """One page of the agent's memories, newest first (every agent of the org when there
        is no agent). Pass next_cursor back as cursor for the next page."""
        token = self.calls.token(ctx)
        who = self.calls.user(user)
        async with self.calls.client(token) as ibex:
            agent_id = await self.calls.run(
                lambda: self.calls.agent_id(ibex, token, agent, required=False)
            )
            page = await self.calls.run(
                lambda: ibex.list_memories(agent_id=agent_id, cursor=cursor, limit=limit, user=who)
            )
        return MemoryPage(
            memories=[memory_out(m) for m in page.items], next_cursor=page.next_cursor
        )


def build_server(config: McpConfig) -> MCPServer[Any]:
    """The MCP server with the five tools, calling the service at ``config.url``."""
    calls = Calls(config)
    server: MCPServer[Any] = MCPServer(
        "ibex",
        lifespan=calls.lifespan,
        title="IBEX memory",
        instructions=(
            "Long-term memory of this agent. Use recall or context before answering questions"
            " about the user or past conversations; remember stable facts and preferences the"
            " user states; forget what the user asks to be forgotten."
        ),
    )
    tools = MemoryTools(calls)
    server.tool(annotations=WRITES)(tools.remember)
    server.tool(annotations=READS)(tools.recall)
    server.tool(annotations=READS)(tools.context)
    server.tool(annotations=DELETES)(tools.forget)
    server.tool(annotations=READS)(tools.list_memories)
    return server
