"""What a chat call adds to a session, the stream reader, and where injection puts the block."""

from __future__ import annotations

import json

from proxy.injection import memory_tokens, with_block
from proxy.streaming import StreamAssembler
from sessions.conversation import StoredTurn, assistant_message, plan_turn, request_hash

SYSTEM = {"role": "system", "content": "Be brief."}
U1 = {"role": "user", "content": "I like tea."}
A1 = {"role": "assistant", "content": "Noted."}
U2 = {"role": "user", "content": "I live in Lyon."}
A2 = {"role": "assistant", "content": "Lovely."}
U3 = {"role": "user", "content": "What do I drink?"}


def test_the_first_call_is_stored_whole() -> None:
    assert plan_turn([], [SYSTEM, U1]).messages == [SYSTEM, U1]


def test_a_call_that_extends_the_conversation_stores_only_its_new_messages() -> None:
    turns = [StoredTurn([SYSTEM, U1], A1)]
    assert plan_turn(turns, [SYSTEM, U1, A1, U2]).messages == [U2]
    turns.append(StoredTurn([U2], A2))
    assert plan_turn(turns, [SYSTEM, U1, A1, U2, A2, U3]).messages == [U3]


def test_a_retried_or_late_call_stores_nothing() -> None:
    turns = [StoredTurn([SYSTEM, U1], A1), StoredTurn([U2], A2)]
    assert plan_turn(turns, [SYSTEM, U1, A1, U2]).recorded
    assert plan_turn(turns, [SYSTEM, U1]).recorded


def test_the_assistant_message_sent_back_may_differ_in_empty_keys() -> None:
    echoed = {"role": "assistant", "content": "Noted.", "refusal": None, "tool_calls": []}
    assert plan_turn([StoredTurn([SYSTEM, U1], A1)], [SYSTEM, U1, echoed, U2]).messages == [U2]


def test_an_edited_conversation_is_stored_whole_and_restarts_it() -> None:
    edited = {"role": "user", "content": "I like coffee."}
    turns = [StoredTurn([SYSTEM, U1], A1)]
    assert plan_turn(turns, [SYSTEM, edited]).messages == [SYSTEM, edited]
    turns.append(StoredTurn([SYSTEM, edited], A2))
    assert plan_turn(turns, [SYSTEM, edited, A2, U3]).messages == [U3]


def test_recalled_blocks_do_not_change_the_conversation() -> None:
    injected = {"role": "system", "content": "Be brief.\n\n<memories>\n- x\n</memories>"}
    turns = [StoredTurn([injected, U1], A1)]
    other = {"role": "system", "content": "Be brief.\n\n<memories>\n- y\n</memories>"}
    assert plan_turn(turns, [other, U1, A1, U2]).messages == [U2]


def test_the_retry_identity_is_the_whole_request() -> None:
    body = {"model": "m", "messages": [U1]}
    assert request_hash(body) == request_hash(json.loads(json.dumps(body)))
    assert request_hash(body) != request_hash({**body, "temperature": 0})
    assert assistant_message({"role": "assistant", "content": "x", "refusal": None}) == {
        "role": "assistant",
        "content": "x",
    }


def _event(data: object) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def test_the_stream_reader_adds_up_content_tool_calls_and_usage_across_chunk_boundaries() -> None:
    stream = b"".join(
        [
            _event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
            _event({"choices": [{"index": 0, "delta": {"content": "Hel"}}]}),
            _event({"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": None}]}),
            _event(
                {
                    "choices": [
                        {
                            "index": 0,
                            "delta": {
                                "tool_calls": [
                                    {
                                        "index": 0,
                                        "id": "c1",
                                        "function": {"name": "f", "arguments": "{"},
                                    }
                                ]
                            },
                        }
                    ]
                }
            ),
            _event(
                {
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]},
                        }
                    ]
                }
            ),
            _event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            _event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}),
            b"data: [DONE]\n\n",
        ]
    )
    reader = StreamAssembler()
    for i in range(0, len(stream), 7):  # cut anywhere, even inside a line
        reader.feed(stream[i : i + 7])
    assert reader.done and reader.finish_reason == "stop"
    assert reader.usage == {"prompt_tokens": 3, "completion_tokens": 2}
    assert reader.message() == {
        "role": "assistant",
        "content": "Hello",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    }


def test_a_stream_without_done_is_not_complete() -> None:
    reader = StreamAssembler()
    reader.feed(_event({"choices": [{"index": 0, "delta": {"content": "Hal"}}]}))
    assert not reader.done and reader.message()["content"] == "Hal"


def test_the_block_goes_into_the_first_system_prompt_or_a_new_one() -> None:
    block = "<memories>\n- Dana likes tea.\n</memories>"
    assert with_block([SYSTEM, U1], block) == [
        {"role": "system", "content": f"Be brief.\n\n{block}"},
        U1,
    ]
    assert with_block([U1], block) == [{"role": "system", "content": block}, U1]
    assert memory_tokens(None) == 400 and memory_tokens("50") == 50
