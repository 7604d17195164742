"""Recall on Responses WebSocket turns (design.md § Recall, issue 16): a socket turn whose request declares
the recall tool is one response for the client, however many rounds it took (one response.created
and one end event, sequence numbers and output indexes without gaps, no recall call, usage summed,
the first round's id); the client's next message waits for the turn's continuation; a later turn
chaining from the shown id (store false: the socket keeps only its latest response) is valid (the
socket reads it as its whole history and sends it unchained), and so is one answering a mixed
turn's client call by previous_response_id (over HTTP the recall call it left unanswered gets an
output; on the socket the whole history as the client saw it goes, without that call). The planted facts, declaration, max_rounds, mixed turn, isolation and
outage tests run on the socket too (tests/every_protocol/test_recall_protocols.py, protocol "responses-ws").
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType

from proxy.prompts import Prompts
from support.recall_facts import build_session
from support.recall_protocols import RESPONSES_TOOLS, driver, responses_input
from test_recall_streams import metric, recall_name

END = ("response.completed", "response.failed", "response.incomplete", "error")


def writes_then_looks_up(body: dict[str, Any]) -> Any:
    if body["messages"][-1]["role"] == "tool":
        return "Found it."
    name = recall_name(body)
    return {"content": "Let me check.", "tool_calls": [{"name": name, "arguments": {"query": "segment"}}]} if name \
        else "no tool"


def looks_up_first(body: dict[str, Any]) -> Any:
    last = body["messages"][-1]
    if last["role"] == "tool":
        return f"Found: {last['content'][:40]}"
    name = recall_name(body)
    return {"content": None, "tool_calls": [{"name": name, "arguments": {"query": "segment"}}]} if name \
        else f"plain answer to {str(last['content'])[:20]}"


def check_one_response(events: list[dict[str, Any]]) -> None:
    types = [e["type"] for e in events]
    assert types.count("response.created") == 1 and types.count("response.completed") == 1
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert len({e["response"]["id"] for e in events if "response" in e}) == 1
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    assert added == list(range(len(added)))
    assert not any(e.get("item", {}).get("type") == "function_call" for e in events)
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert events[-1]["response"]["output"] == done


async def test_a_recall_turn_on_the_socket_is_one_response_and_a_late_lookup_is_counted() -> None:
    async with driver("responses-ws") as d:
        history, _ = build_session(turns=40, facts_per_kind=(3, 3, 3, 3))
        await d.play(history)
        d.set_reply(writes_then_looks_up)
        d.fake.clear_requests()
        a = await d.send([*history, {"role": "user", "content": "check it"}])
        events = [e.model_dump(exclude_none=True) for e in d.events]
        check_one_response(events)
        assert a.text == "Let me check.Found it."  # what went out before the lookup stays
        assert len(d.requests) == 2 and "context_recall" not in json.dumps(events)
        # usage: both rounds'
        usage = events[-1]["response"]["usage"]
        assert usage["input_tokens"] == sum(r.prompt_tokens for r in d.fake.records("responses"))
        # the report in response.created counted no lookup (it went out with "Let me check."); the end says 1
        assert events[0]["response"]["metadata"]["x-compaction-recalls"] == "0"
        assert events[-1]["response"]["metadata"]["x-compaction-recalls"] == "1"
        assert await metric(d.proxy.root, "compaction_proxy_recall_calls_after_headers_total", protocol="responses") == 1
        assert await metric(d.proxy.root, "compaction_proxy_recall_rounds_total", protocol="responses") == 1


async def test_the_clients_next_message_waits_for_the_recall_turns_continuation() -> None:
    """The client sends its next response.create before the recall turn ended: the upstream gets
    the turn, its continuation, then the next message, and the client two whole responses in order."""
    async with driver("responses-ws") as d:
        history, _ = build_session(turns=40, facts_per_kind=(3, 3, 3, 3))
        await d.play(history)
        d.set_reply(looks_up_first)
        d.fake.clear_requests()
        instructions, items = responses_input([*history, {"role": "user", "content": "check it"}])
        first = {"type": "response.create", "model": "m", "instructions": instructions, "input": items,
                 "tools": RESPONSES_TOOLS}
        second = {"type": "response.create", "model": "m", "input": "second question", "store": False}
        url = d.proxy.base_url.replace("http://", "ws://") + "/responses"
        async with aiohttp.ClientSession() as s, s.ws_connect(url, headers={"Authorization": "Bearer sk-recall"}) as ws:
            await ws.send_str(json.dumps(first))
            await ws.send_str(json.dumps(second))  # at once, as a pipelining client may
            got: list[list[dict[str, Any]]] = [[], []]
            for turn in got:
                while True:
                    msg = await ws.receive()
                    assert msg.type == WSMsgType.TEXT, msg
                    turn.append(json.loads(msg.data))
                    if turn[-1]["type"] in END:
                        break
        check_one_response(got[0])
        assert got[0][-1]["response"]["output"][0]["content"][0]["text"].startswith("Found: ")
        assert got[1][-1]["type"] == "response.completed"
        assert got[1][-1]["response"]["output"][0]["content"][0]["text"] == "plain answer to second question"
        sent = [r.json for r in d.fake.records("responses")]
        assert len(sent) == 3
        assert any(it.get("type") == "function_call_output" for it in sent[1]["input"])  # the continuation
        assert sent[2]["input"] == "second question"


async def test_a_turn_chained_from_a_socket_recall_turn_is_valid_with_store_false() -> None:
    """The socket keeps only its latest response (store false): the one the recall turn's last round
    made. The client chains from the id it was shown; the proxy sends that round's id on."""
    async with driver("responses-ws") as d:
        d.extra = {"store": False}
        history, facts = build_session(turns=40, facts_per_kind=(3, 3, 3, 3))
        await d.play(history)
        d.fake.clear_requests()
        fact = facts[0]
        a = await d.send([*history, {"role": "user", "content": fact.question()}])
        assert len(d.requests) == 2 and fact.text in a.text  # one recall round
        shown = d.events[0].response.id
        assert a.raw.id == shown
        b = await d.ws_turn({"model": "m", "previous_response_id": shown, "store": False,
                             "input": [{"role": "user", "content": "thanks"}]})
        assert b.stop == "completed", b.raw
        # The socket saw the whole chain: the turn goes as the history it stands for, whole and
        # unchained (the upstream's latest response is the recall round's, which the client never
        # saw), the answer the client was shown in it and the new message last ...
        sent = d.requests[-1]
        assert "previous_response_id" not in sent
        assert sent["input"][-1]["content"] == "thanks" and fact.text in json.dumps(sent["input"][-2])
        # ... and the turn after it chains to that response again, with only its new items.
        c = await d.ws_turn({"model": "m", "previous_response_id": b.raw.id, "store": False,
                             "input": [{"role": "user", "content": "and then?"}]})
        assert c.stop == "completed", c.raw
        assert d.requests[-1]["previous_response_id"] == b.raw.id
        assert d.requests[-1]["input"] == [{"role": "user", "content": "and then?"}]


@pytest.mark.parametrize(("protocol", "stream"), [("responses-ws", True), ("responses", True), ("responses", False)])
async def test_a_mixed_turn_answered_by_previous_response_id_is_valid(protocol: str, stream: bool) -> None:
    """The turn called recall and read_file; the client got read_file only and answers it chaining
    from the response (its output alone): the upstream also gets an output for the recall call."""
    def mixed(body: dict[str, Any]) -> Any:
        last = body["messages"][-1]
        if last["role"] == "tool":
            return f"read it: {last['content']}"
        return {"content": "Looking.", "tool_calls": [{"name": recall_name(body), "arguments": {"query": "segment"}},
                                                      {"name": "read_file", "arguments": {"path": "a.py"}}]}

    async with driver(protocol) as d:
        history, _ = build_session(turns=40, facts_per_kind=(3, 3, 3, 3))
        await d.play(history)
        d.set_reply(mixed)
        d.fake.clear_requests()
        a = await d.send([*history, {"role": "user", "content": "read a.py"}], stream=stream)
        assert [c["name"] for c in a.calls] == ["read_file"] and len(d.requests) == 1
        follow = {"model": "m", "previous_response_id": a.raw.id, "tools": RESPONSES_TOOLS,
                  "input": [{"type": "function_call_output", "call_id": a.calls[0]["id"], "output": "print('a')"}]}
        if protocol == "responses-ws":
            b = await d.ws_turn(follow)
            text = b.text
        else:
            text = (await d.client.responses.create(**follow)).output_text
        assert text == "read it: print('a')"
        sent = d.requests[-1]["input"]
        if protocol == "responses-ws":
            # the socket reads the turn as its whole history, as the client saw it: the recall
            # call was never in it, so neither is an output for it
            assert "previous_response_id" not in d.requests[-1]
            assert sent[-1]["call_id"] == a.calls[0]["id"] and sent[-1]["output"] == "print('a')"
            assert Prompts().text("recall-unanswered") not in json.dumps(sent)
            assert not [it for it in sent if it.get("type") == "function_call"
                        and str(it.get("name")).startswith("context_recall")]
            return
        assert sent[0]["type"] == "function_call_output" and sent[0]["output"] == Prompts().text("recall-unanswered")
        assert sent[1]["call_id"] == a.calls[0]["id"]
