"""``GET /v1/agents/{agent}``: one of the org's agents by slug or id (the resolution is
:class:`sessions.agents.AgentResolver`'s)."""

from __future__ import annotations

import uuid

import falcon

from memory_service.http import Api, authenticate, respond_json
from sessions.agents import AgentResolver


class AgentResource:
    """``GET /v1/agents/{agent}``: the org's agent by slug or id, as ``{"id", "slug"}`` (404
    ``UNKNOWN_AGENT`` otherwise), for callers that hold a slug and need the id a route takes
    (``POST /v1/memories``, ``GET /v1/memories?agent_id=``). Any token of the org may ask:
    an agent's name is no one's memory."""

    def __init__(self, api: Api, agents: AgentResolver) -> None:
        self.api = api
        self.agents = agents

    def on_get(self, req: falcon.Request, resp: falcon.Response, agent: str) -> None:
        _, org_id = authenticate(self.api, req, None)
        try:
            by_id: uuid.UUID | None = uuid.UUID(agent)
        except ValueError:
            by_id = None
        if by_id is not None:
            found = self.agents.resolve(org_id, agent_id=by_id)
        else:
            found = self.agents.resolve(org_id, slug=agent)
        respond_json(resp, 200, {"id": str(found), "slug": self.agents.slug(org_id, found)})
