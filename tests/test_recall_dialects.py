"""The recall dialects' pure parts (proxy/protocols/responses/recall.py, messages.py and their stream
filters): the cases the flows through the fakes reach rarely — a reasoning item right before a
recall call, a request that is not stored, a turn with nothing but a dropped call, empty text
blocks, a thinking block kept for the continuation. Every body made here is checked by the
protocol's strict fake validation."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.fakes.messages import FakeMessages
from proxy.fakes.messages.validate import Context as MContext
from proxy.fakes.messages.validate import check_request as check_messages
from proxy.fakes.responses import FakeResponses
from proxy.fakes.responses.validate import Context as RContext
from proxy.fakes.responses.validate import check_request as check_responses
from proxy.prompts import Prompts
from proxy.recall.answers import Call
from proxy.protocols.messages.recall import MESSAGES
from proxy.protocols.messages.recall_stream import Rounds as MessagesRounds
from proxy.recall.relay import answered_here
from proxy.protocols.responses.recall import RESPONSES, visible
from proxy.protocols.responses.recall_stream import Rounds as ResponsesRounds

NAME = "context_recall"


def fc(call_id: str, name: str = NAME) -> dict[str, Any]:
    return {"id": "fc_" + call_id, "type": "function_call", "status": "completed", "call_id": call_id, "name": name,
            "arguments": '{"query": "q"}'}


def reasoning(rid: str, enc: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"id": rid, "type": "reasoning", "summary": []}
    if enc is not None:
        out["encrypted_content"] = enc
    return out


def test_a_reasoning_item_before_a_recall_call_leaves_with_it_and_one_before_a_client_call_stays() -> None:
    items = [reasoning("rs_1"), fc("r1"), reasoning("rs_2"), fc("c1", "read_file"), {"type": "message", "id": "m"}]
    assert [it["id"] for it in visible(items, NAME)] == ["rs_2", "fc_c1", "m"]


def test_a_responses_continuation_is_a_valid_input_and_drops_reasoning_it_cannot_send_back() -> None:
    fake = FakeResponses()
    rs = "rs_" + "a" * 24
    enc = fake.reasoning_token(rs, fc("r1"))
    body = {"model": "m", "input": "what was it?", "store": False, "tools": [RESPONSES.declaration(NAME, Prompts())]}
    answer = {"output": [reasoning(rs, enc), fc("r1")]}
    out = RESPONSES.continuation(body, answer, [Call("r1", '{"query": "q"}')], ["the original"], last=True)
    assert [it.get("type") for it in out["input"]] == ["message", "reasoning", "function_call", "function_call_output"]
    assert out["tool_choice"] == "none"
    check_responses(out, RContext(signer=fake.signer))  # the signed reasoning right before its call
    # not stored and no encrypted_content: the upstream could not find it again, so it stays out
    bare = RESPONSES.continuation(body, {"output": [reasoning(rs), fc("r1")]}, [Call("r1", "{}")], ["x"], last=False)
    assert [it.get("type") for it in bare["input"]] == ["message", "function_call", "function_call_output"]
    check_responses(bare, RContext(signer=fake.signer))


def test_a_messages_continuation_keeps_signed_thinking_first_and_leaves_empty_text_out() -> None:
    fake = FakeMessages()
    thinking = {"type": "thinking", "thinking": "look it up", "signature": fake.sign_thinking("look it up")}
    body = {"model": "m", "max_tokens": 2048, "thinking": {"type": "enabled", "budget_tokens": 1024},
            "messages": [{"role": "user", "content": "what was it?"}], "tools": [MESSAGES.declaration(NAME, Prompts())]}
    answer = {"type": "message", "content": [thinking, {"type": "text", "text": ""},
                                             {"type": "tool_use", "id": "toolu_1", "name": NAME, "input": {"query": "q"}}]}
    split = MESSAGES.split(answer, NAME)
    assert split.recall == [Call("toolu_1", '{"query":"q"}')] and split.client == 0
    out = MESSAGES.continuation(body, answer, split.recall, ["the original"], last=True)
    assert [b["type"] for b in out["messages"][1]["content"]] == ["thinking", "tool_use"]
    assert out["messages"][2]["content"] == [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "the original"}]
    assert out["tool_choice"] == {"type": "none"}
    check_messages(out, MContext(signer=fake.signer))


def test_a_messages_turn_of_only_dropped_recall_calls_ends_its_turn() -> None:
    rounds = [{"type": "message", "id": "a", "content": [{"type": "text", "text": "Looking."},
                                                        {"type": "tool_use", "id": "t1", "name": NAME, "input": {}}],
               "stop_reason": "tool_use", "usage": {"input_tokens": 10, "output_tokens": 2}},
              {"type": "message", "id": "b", "content": [{"type": "tool_use", "id": "t2", "name": NAME, "input": {}}],
               "stop_reason": "tool_use", "usage": {"input_tokens": 20, "output_tokens": 3}}]
    out = MESSAGES.merged(rounds, NAME)
    assert out["content"] == [{"type": "text", "text": "Looking."}] and out["stop_reason"] == "end_turn"
    assert out["usage"] == {"input_tokens": 30, "output_tokens": 5}


def sse(payload: dict[str, Any]) -> bytes:
    return b"event: " + payload["type"].encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def parse(out: list[bytes]) -> list[dict[str, Any]]:
    return [orjson.loads(line[5:]) for e in out for line in e.splitlines() if line.startswith(b"data:")]


def test_a_responses_stream_holds_reasoning_until_it_knows_what_follows() -> None:
    r = ResponsesRounds(NAME)
    r.start()
    out: list[bytes] = []
    created = {"id": "resp_1", "created_at": 1, "output": [], "tools": [{"type": "function", "name": NAME}]}
    out += r.feed(sse({"type": "response.created", "sequence_number": 0, "response": created}))
    out += r.feed(sse({"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
                       "item": reasoning("rs_1")}))
    out += r.feed(sse({"type": "response.output_item.done", "sequence_number": 2, "output_index": 0,
                       "item": reasoning("rs_1")}))
    assert out == []  # nothing shown yet: not even response.created (the headers wait too)
    out += r.feed(sse({"type": "response.output_item.added", "sequence_number": 3, "output_index": 1, "item": fc("r1")}))
    out += r.feed(sse({"type": "response.output_item.done", "sequence_number": 4, "output_index": 1, "item": fc("r1")}))
    out += r.feed(sse({"type": "response.completed", "sequence_number": 5,
                       "response": {**created, "usage": {"input_tokens": 5, "output_tokens": 1}}}))
    assert out == [] and answered_here(r, over=False)
    assert [c.id for c in r.recall_calls()] == ["r1"]
    # the continuation: its own response id, a message at its index 0
    r.start()
    second = {"id": "resp_2", "created_at": 2, "output": []}
    msg = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    out += r.feed(sse({"type": "response.created", "sequence_number": 0, "response": second}))
    out += r.feed(sse({"type": "response.output_item.added", "sequence_number": 1, "output_index": 0, "item": msg}))
    out += r.feed(sse({"type": "response.output_item.done", "sequence_number": 2, "output_index": 0, "item": msg}))
    out += r.feed(sse({"type": "response.completed", "sequence_number": 3,
                       "response": {**second, "usage": {"input_tokens": 7, "output_tokens": 2}}}))
    assert not answered_here(r, over=False)
    got = parse(out + r.close())
    assert [e["type"] for e in got] == ["response.created", "response.output_item.added", "response.output_item.done",
                                        "response.completed"]
    assert [e["sequence_number"] for e in got] == [0, 1, 2, 3] and got[1]["output_index"] == 0
    end = got[-1]["response"]
    assert end["id"] == "resp_1" and end["output"] == [msg] and end["usage"] == {"input_tokens": 12, "output_tokens": 3}
    assert got[0]["response"]["tools"] == [] and r.ids() == ("resp_1", "resp_2")


def test_a_messages_stream_renumbers_blocks_and_sums_usage_in_one_message() -> None:
    r = MessagesRounds(NAME)
    r.start()
    out: list[bytes] = []

    def start(mid: str, n: int) -> bytes:
        return sse({"type": "message_start", "message": {"id": mid, "content": [], "usage": {"input_tokens": n,
                                                                                            "output_tokens": 1}}})

    out += r.feed(start("msg_a", 10))
    out += r.feed(sse({"type": "content_block_start", "index": 0,
                       "content_block": {"type": "tool_use", "id": "t1", "name": NAME, "input": {}}}))
    out += r.feed(sse({"type": "content_block_delta", "index": 0,
                       "delta": {"type": "input_json_delta", "partial_json": '{"query": "q"}'}}))
    out += r.feed(sse({"type": "content_block_stop", "index": 0}))
    out += r.feed(sse({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 4}}))
    out += r.feed(sse({"type": "message_stop"}))
    # only message_start went out (at once); the recall block and the round's end stay here
    assert [e["type"] for e in parse(out)] == ["message_start"]
    assert answered_here(r, over=False) and r.recall_calls() == [Call("t1", '{"query":"q"}')]
    r.start()
    out += r.feed(start("msg_b", 30))
    out += r.feed(sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}))
    out += r.feed(sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Found."}}))
    out += r.feed(sse({"type": "content_block_stop", "index": 0}))
    out += r.feed(sse({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 6}}))
    out += r.feed(sse({"type": "message_stop"}))
    assert not answered_here(r, over=False)
    got = parse(out + r.close())
    assert [e["type"] for e in got] == ["message_start", "content_block_start", "content_block_delta",
                                        "content_block_stop", "message_delta", "message_stop"]
    assert got[0]["message"]["id"] == "msg_a" and got[1]["index"] == 0
    assert got[4]["usage"] == {"input_tokens": 40, "output_tokens": 10}
