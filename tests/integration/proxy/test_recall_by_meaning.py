"""A new user's scene on the chat path: the memories a person gave are brought back when a
request bears on them, though it shares no word with them.

Dana's memories are "The user is allergic to peanuts." and "The user moved to Munich." among
a few others; another person of the same agent has their own. Through the proxy (fake
upstream, injection on), "Can you suggest a snack for my trip?" must reach the upstream with
the allergy in its system prompt, and "where does she live?" must find Munich: in the injected
block, and in a search of her memories. Never another person's memories.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.integration.memory_service.helpers import Tenant
from tests.integration.proxy.conftest import Org, ProxyServer
from tests.integration.proxy.test_chat_path import SYSTEM, chat
from tests.integration.proxy.test_injection_and_outages import memories  # noqa: F401

pytestmark = pytest.mark.integration

DANA = [
    "The user is allergic to peanuts.",
    "The user moved to Munich.",
    "The user works as a translator.",
    "The user plays the cello on weekends.",
    "The user drives an old blue Volkswagen.",
    "The user's favourite film is Amélie.",
    "The user is learning to bake sourdough.",
]
SAM = ["The user is allergic to shellfish.", "The user lives in Oslo."]


def write(http: httpx.Client, tenant_: Tenant, content: str, user: str) -> str:
    body = {"agent_id": str(tenant_.agent_id), "content": content, "user": user}
    response = http.post("/v1/memories", json=body, headers=tenant_.headers(tenant_.writer))
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def injected(server: ProxyServer, upstream: Any, org: Org, question: str, **extra: str) -> str:
    """The system prompt the upstream received for ``question`` asked by Dana."""
    hdrs = {
        "X-IBEX-Token": org.token,
        "X-IBEX-Agent": "bot",
        "X-IBEX-User": "dana",
        "X-IBEX-Memory": "inject",
        **extra,
    }
    answer = chat(server, [SYSTEM, {"role": "user", "content": question}], hdrs)
    assert answer.status_code == 200, answer.text
    sent = upstream.bodies[-1]["messages"]
    assert sent[0]["role"] == "system" and sent[0]["content"].startswith(SYSTEM["content"])
    return str(sent[0]["content"])


@pytest.fixture
def people(memories: tuple[Tenant, httpx.Client]) -> tuple[Tenant, httpx.Client]:  # noqa: F811
    tenant_, http = memories
    for content in DANA:
        write(http, tenant_, content, "dana")
    for content in SAM:
        write(http, tenant_, content, "sam")
    return tenant_, http


def test_a_snack_for_the_trip_brings_the_allergy_and_home_is_munich(
    proxy_server: ProxyServer, upstream: Any, acme: Org, people: tuple[Tenant, httpx.Client]
) -> None:
    tenant_, http = people
    prompt = injected(proxy_server, upstream, acme, "Can you suggest a snack for my trip?")
    assert "- The user is allergic to peanuts." in prompt
    assert "shellfish" not in prompt and "Oslo" not in prompt  # Sam's, never Dana's block
    # The person first: the allergy (a constraint) leads the block.
    block = prompt[prompt.index("<memories>") :]
    assert block.startswith("<memories>\n- The user is allergic to peanuts.\n")

    prompt = injected(proxy_server, upstream, acme, "where does she live?")
    assert "- The user moved to Munich." in prompt and "Oslo" not in prompt

    found = http.post(
        "/v1/memories/search",
        json={"agent_id": str(tenant_.agent_id), "query": "where does she live?", "user": "dana"},
        headers=tenant_.headers(tenant_.reader),
    )
    assert found.status_code == 200, found.text
    hits = [h["content"] for h in found.json()["items"]]
    assert "The user moved to Munich." in hits[:5]
    assert not {"The user lives in Oslo.", "The user is allergic to shellfish."} & set(hits)


def test_on_a_tight_budget_the_standing_facts_come_first(
    proxy_server: ProxyServer, upstream: Any, acme: Org, people: tuple[Tenant, httpx.Client]
) -> None:
    """Not all of Dana's memories fit 40 tokens: the standing facts (the constraint, who she
    is, where she lives) are chosen without the query, so the snack question still gets the
    allergy, and a question about nothing she said gets the same block and nothing else."""
    for question in ("Can you suggest a snack for my trip?", "How many ounces are in a pound?"):
        prompt = injected(proxy_server, upstream, acme, question, **{"X-IBEX-Memory-Tokens": "40"})
        block = prompt[prompt.index("<memories>") :]
        assert block == (
            "<memories>\n- The user is allergic to peanuts.\n- The user works as a translator.\n"
            "- The user moved to Munich.\n</memories>"
        ), block
