"""An application's side of IBEX, end to end, through the public Python client.

Feeds one person's conversation through the sessions API (a session of the user ``dana``, its
turns, completed), waits while the pipeline extracts it (a worker and the scheduler must be
running against the same database), then asks for the context to put in the next system
prompt: Dana's memories (and the agent's agent-wide ones), never another person's:

    ibex token create --org acme --create-org \\
        --scope sessions:write --scope sessions:read --scope memory:read > token.txt
    python examples/chat_with_memory.py http://127.0.0.1:8000 < token.txt

The token is read from standard input, so it never appears in a process list.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable

from ibex_client import Context, IbexClient, Session, Turn

CONVERSATION = [
    Turn(
        1,
        [{"role": "user", "content": "Hi, I'm Dana and I'm allergic to peanuts."}],
        {"role": "assistant", "content": "Noted, Dana! I'll keep that in mind."},
        prompt_tokens=21,
        completion_tokens=9,
        latency_ms=640,
    ),
    Turn(
        2,
        [
            {"role": "user", "content": "Hi, I'm Dana and I'm allergic to peanuts."},
            {"role": "assistant", "content": "Noted, Dana! I'll keep that in mind."},
            {"role": "user", "content": "I live in Lisbon and I love hiking."},
        ],
        {"role": "assistant", "content": "Lisbon has great trails nearby."},
        prompt_tokens=48,
        completion_tokens=7,
        latency_ms=580,
    ),
]
#: The first message of a later conversation: the context must bring back the allergy.
NEXT_QUESTION = (
    "It's Dana again: I'm hiking near Lisbon this weekend. Should I pack peanut butter sandwiches?"
)


def wait_until_extracted(
    ibex: IbexClient,
    session: Session,
    *,
    timeout: float = 120.0,
    interval: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Session:
    """Poll the session until the pipeline's pointer has reached its last turn.

    A turn whose extraction failed (dead-lettered) stops the pointer until an operator replays
    it (``ibex dlq replay``), so waiting longer would not help: that is an error at once.
    """
    deadline = clock() + timeout
    while not session.extracted:
        if session.progress.failed:
            raise RuntimeError(
                f"session {session.id}: {session.progress.failed} turns failed extraction; "
                "see `ibex dlq list`"
            )
        if clock() >= deadline:
            raise TimeoutError(
                f"session {session.id}: {session.last_extracted_turn} of {session.turn_count} "
                f"turns extracted after {timeout:.0f} s; are a worker and the scheduler running?"
            )
        sleep(interval)
        session = ibex.get_session(session.id)
    return session


def run(
    ibex: IbexClient,
    *,
    agent: str = "support-bot",
    user: str = "dana",
    timeout: float = 120.0,
    interval: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[Session, Context]:
    """Feed ``user``'s conversation, wait for extraction, and return the extracted session and
    the context for what comes next (that user's memories)."""
    # The external id makes the create safe to retry: a repeat finds this session. The user
    # (the application's key for the person, created when missing) makes the memories theirs.
    # create_agent: the first run makes the agent; an unknown slug is refused otherwise.
    session = ibex.create_session(
        agent,
        create_agent=True,
        external_id=f"example-{uuid.uuid4()}",
        model="gpt-4o-mini",
        provider="openai",
        user=user,
    )
    ibex.append_turns(session.id, CONVERSATION)
    session = ibex.complete_session(session.id)
    session = wait_until_extracted(ibex, session, timeout=timeout, interval=interval, sleep=sleep)
    context = ibex.context(
        session.agent_id,
        messages=[{"role": "user", "content": NEXT_QUESTION}],
        max_tokens=200,
        user=user,
    )
    return session, context


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="base URL of the IBEX web process")
    parser.add_argument("--agent", default="support-bot", help="agent slug (default: %(default)s)")
    parser.add_argument("--user", default="dana", help="the person's key (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait")
    parser.add_argument(
        "--interval", type=float, default=1.0, help="seconds between polls (default: 1)"
    )
    args = parser.parse_args(argv)
    token = sys.stdin.readline().strip()
    if not token:
        parser.error("give the API token on standard input")
    with IbexClient(args.url, token) as ibex:
        session, context = run(
            ibex, agent=args.agent, user=args.user, timeout=args.timeout, interval=args.interval
        )
    progress = session.progress
    print(
        f"session {session.id}: {progress.done} of {session.turn_count} turns extracted "
        f"(pointer {progress.pointer}, {progress.failed} failed)"
    )
    print(context.context or "(no memories matched)")
    print(f"{len(context.memories)} memories, {context.tokens} tokens, {context.dropped} dropped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
