"""A recall round inside an event stream, read as raw SSE (design.md § Recall), on every protocol: one
response (Responses: one response.created and one response.completed, sequence numbers 0..n-1,
output indexes from 0 with no gap, the completed output as the client saw it; Messages: one
message_start and one message_stop, block indexes from 0 with no gap; chat: one id, one [DONE]),
no trace of the recall call, text relayed before the call kept; and the count of lookups made after
the headers went out: in an SSE comment at the end, in the log and in /metrics.
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import anthropic
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.recall_facts import build_session
from support.recall_protocols import MESSAGES_TOOLS, RESPONSES_TOOLS, TOOLS, driver, messages_body, responses_input


def recall_name(body: dict[str, Any]) -> str | None:
    return next((t["function"]["name"] for t in body.get("tools") or ()
                 if t["function"]["name"].startswith("context_recall")), None)


def writes_then_looks_up(body: dict[str, Any]) -> Any:
    """Says something, then looks up (so the headers go out before the lookup), then answers."""
    last = body["messages"][-1]
    if last["role"] == "tool":
        return "Found it."
    name = recall_name(body)
    return {"content": "Let me check.", "tool_calls": [{"name": name, "arguments": {"query": "segment"}}]} if name \
        else "no tool"


def request(protocol: str, messages: list[dict[str, Any]]) -> tuple[str, dict[str, Any], dict[str, str]]:
    if protocol == "chat":
        return "/v1/chat/completions", {"model": "m", "messages": messages, "tools": TOOLS, "stream": True,
                                        "stream_options": {"include_usage": True}}, {"Authorization": "Bearer sk-recall"}
    if protocol == "responses":
        instructions, items = responses_input(messages)
        return "/v1/responses", {"model": "m", "instructions": instructions, "input": items, "tools": RESPONSES_TOOLS,
                                 "stream": True}, {"Authorization": "Bearer sk-recall"}
    system, msgs = messages_body(messages)
    return "/v1/messages", {"model": "m", "max_tokens": 4096, "system": system, "messages": msgs,
                            "tools": MESSAGES_TOOLS, "stream": True}, {"x-api-key": "sk-recall",
                                                                        "anthropic-version": "2023-06-01"}


def events(raw: bytes) -> tuple[list[Any], list[bytes]]:
    """(data payloads, comment lines) of an SSE body."""
    data, comments = [], []
    for block in raw.split(b"\n\n"):
        for line in block.splitlines():
            if line.startswith(b":"):
                comments.append(line)
            elif line.startswith(b"data:"):
                payload = line[5:].strip()
                data.append("[DONE]" if payload == b"[DONE]" else orjson.loads(payload))
    return data, comments


def check_one_response(protocol: str, data: list[Any]) -> str:
    """The stream is one well-formed response of its protocol; returns the text it carries."""
    if protocol == "chat":
        assert data[-1] == "[DONE]" and data.count("[DONE]") == 1
        chunks = data[:-1]
        assert len({c["id"] for c in chunks}) == 1
        assert not any(c["choices"] and c["choices"][0]["delta"].get("tool_calls") for c in chunks)
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]] \
            == ["stop"]
        return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    if protocol == "responses":
        types = [e["type"] for e in data]
        assert types.count("response.created") == 1 and types.count("response.completed") == 1
        assert types[0] == "response.created" and types[-1] == "response.completed"
        assert [e["sequence_number"] for e in data] == list(range(len(data)))
        ids = {e["response"]["id"] for e in data if "response" in e}
        assert len(ids) == 1
        added = [e["output_index"] for e in data if e["type"] == "response.output_item.added"]
        assert added == list(range(len(added)))
        assert not any(e.get("item", {}).get("type") == "function_call" for e in data)
        done = [e["item"] for e in data if e["type"] == "response.output_item.done"]
        assert data[-1]["response"]["output"] == done
        return "".join(e["delta"] for e in data if e["type"] == "response.output_text.delta")
    types = [e["type"] for e in data]
    assert types.count("message_start") == 1 and types.count("message_stop") == 1
    assert types[0] == "message_start" and types[-1] == "message_stop"
    starts = [e["index"] for e in data if e["type"] == "content_block_start"]
    assert starts == list(range(len(starts)))
    assert not any(e.get("content_block", {}).get("type") == "tool_use" for e in data)
    (delta,) = [e for e in data if e["type"] == "message_delta"]
    assert delta["delta"]["stop_reason"] == "end_turn"
    return "".join(e["delta"].get("text", "") for e in data if e["type"] == "content_block_delta")


async def metric(root: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include `labels`."""
    async with aiohttp.ClientSession() as s:
        async with s.get(root + "/metrics") as r:
            text = await r.text()
    return sum(x.value for f in text_string_to_metric_families(text) for x in f.samples
               if x.name == name and labels.items() <= x.labels.items())


@pytest.mark.parametrize("protocol", ["chat", "responses", "messages"])
async def test_a_lookup_after_the_first_event_streams_into_the_same_response_and_is_counted(protocol: str,
                                                                                            caplog) -> None:
    caplog.set_level(logging.INFO, logger="proxy.recall")
    async with driver(protocol) as d:
        history, _ = build_session(turns=40, facts_per_kind=(3, 3, 3, 3))
        await d.play(history)
        d.set_reply(writes_then_looks_up)
        d.fake.clear_requests()
        path, body, headers = request(protocol, [*history, {"role": "user", "content": "check it"}])
        async with aiohttp.ClientSession() as s:
            async with s.post(d.proxy.root + path, json=body, headers=headers) as r:
                assert r.status == 200
                raw = await r.read()
                header = r.headers["x-compaction-recalls"]
        data, comments = events(raw)
        text = check_one_response(protocol, data)
        assert text.startswith("Let me check.") and text.endswith("Found it.")  # what went out first stays
        assert len(d.requests) == 2 and b"context_recall" not in raw
        # the headers went out with "Let me check.": the lookup after it is counted where a stream can say it
        assert header == "0"
        assert comments == [b": x-compaction-recalls: 1"]
        assert await metric(d.proxy.root, "compaction_proxy_recall_calls_after_headers_total", protocol=protocol) == 1
        assert "1 of 1 lookup(s) came after the stream's headers" in caplog.text


@pytest.mark.parametrize("protocol", ["chat", "responses", "messages"])
async def test_a_lookup_before_any_output_is_in_the_header_and_no_comment_is_added(protocol: str) -> None:
    def looks_up_first(body: dict[str, Any]) -> Any:
        if body["messages"][-1]["role"] == "tool":
            return "Found it."
        name = recall_name(body)
        return {"content": None, "tool_calls": [{"name": name, "arguments": {"query": "segment"}}]} if name else "no"

    async with driver(protocol) as d:
        history, _ = build_session(turns=40, facts_per_kind=(3, 3, 3, 3))
        await d.play(history)
        d.set_reply(looks_up_first)
        path, body, headers = request(protocol, [*history, {"role": "user", "content": "check it"}])
        async with aiohttp.ClientSession() as s:
            async with s.post(d.proxy.root + path, json=body, headers=headers) as r:
                raw = await r.read()
                header = r.headers["x-compaction-recalls"]
        data, comments = events(raw)
        assert check_one_response(protocol, data) == "Found it."
        if protocol == "messages":  # its message_start goes out at once, with the headers: the count at the end
            assert header == "0" and comments == [b": x-compaction-recalls: 1"]
        else:
            assert header == "1" and comments == []


@pytest.mark.parametrize("protocol", ["chat", "responses", "messages"])
async def test_recall_calls_and_rounds_are_counted_by_protocol(protocol: str) -> None:
    """/metrics: a round of two lookups (one hit, one miss) counts two calls and one round under the
    route's protocol label, and nothing under the others."""
    def two_lookups(body: dict[str, Any]) -> Any:
        if body["messages"][-1]["role"] == "tool":
            return "Found it."
        name = recall_name(body)
        return {"content": None, "tool_calls": [{"name": name, "arguments": {"query": "segment"}},
                                                 {"name": name, "arguments": {"handle": "0123456789ab"}}]} \
            if name else "no tool"

    async with driver(protocol) as d:
        history, _ = build_session(turns=40, facts_per_kind=(3, 3, 3, 3))
        await d.play(history)
        d.set_reply(two_lookups)
        assert (await d.send([*history, {"role": "user", "content": "check it"}])).text == "Found it."
        root = d.proxy.root
        assert await metric(root, "compaction_proxy_recall_calls_total", protocol=protocol, outcome="hit") == 1
        assert await metric(root, "compaction_proxy_recall_calls_total", protocol=protocol, outcome="miss") == 1
        assert await metric(root, "compaction_proxy_recall_rounds_total", protocol=protocol) == 1
        for other in {"chat", "responses", "messages"} - {protocol}:
            assert await metric(root, "compaction_proxy_recall_calls_total", protocol=other) == 0
            assert await metric(root, "compaction_proxy_recall_rounds_total", protocol=other) == 0


def _event_names(raw: bytes) -> list[str]:
    return [line[6:].strip().decode() for line in raw.splitlines() if line.startswith(b"event:")]


async def _raw_stream(client: Any, body: dict[str, Any]) -> tuple[bytes, Any]:
    """One streamed Messages request through the real `anthropic` client, read as raw SSE."""
    async with client.messages.with_streaming_response.create(**body) as resp:
        return b"".join([chunk async for chunk in resp.iter_bytes()]), resp.headers


async def test_a_messages_recall_stream_relays_message_start_at_once_and_every_ping() -> None:
    """The client's events are the upstream's in their order: round 1's message_start and ping go
    out at once (the ping came after the held recall block's start), then round 2's blocks, pings
    and end; no second message_start. The headers went out with message_start, before the lookup."""
    def looks_up_first(body: dict[str, Any]) -> Any:
        if body["messages"][-1]["role"] == "tool":
            return "Found it."
        name = recall_name(body)
        return {"content": None, "tool_calls": [{"name": name, "arguments": {"query": "segment"}}]} if name else "no"

    async with driver("messages") as d:
        history, _ = build_session(turns=40, facts_per_kind=(3, 3, 3, 3))
        await d.play(history)
        d.set_reply(looks_up_first)
        d.fake.clear_requests()
        system, msgs = messages_body([*history, {"role": "user", "content": "check it"}])
        body = {"model": "m", "max_tokens": 4096, "system": system, "messages": msgs, "tools": MESSAGES_TOOLS,
                "stream": True}
        raw, headers = await _raw_stream(d.client, body)
        rounds = list(d.requests)
        assert len(rounds) == 2
        # the upstream's own streams for the two forwarded bodies, asked straight from the fake
        direct = anthropic.AsyncAnthropic(base_url=d.fake.base_url, api_key="sk-recall", max_retries=0)
        try:
            upstream = [_event_names((await _raw_stream(direct, {**b, "stream": True}))[0]) for b in rounds]
        finally:
            await direct.close()
        assert upstream[0][:3] == ["message_start", "content_block_start", "ping"]  # the recall block, then a ping
        expected = [e for e in upstream[0] if e in ("message_start", "ping")] + \
            [e for e in upstream[1] if e != "message_start"]
        assert _event_names(raw) == expected
        data, comments = events(raw)
        assert check_one_response("messages", data) == "Found it."
        assert headers["x-compaction-recalls"] == "0" and comments == [b": x-compaction-recalls: 1"]
