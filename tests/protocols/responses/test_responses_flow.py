"""POST /v1/responses through the proxy's flow (issue 14 items 1-4, 7): the real `openai` client
(sync, async, streaming, tools, string and item input) against the strict fake Responses upstream,
which checks pairing, reasoning order and roles and records every forwarded and summarizer request.
Tool outputs become notes, the history is summarized into a user message after the leading
developer items with the annotation in `instructions`, a stored summary is reused byte for byte,
stateful and native-compaction requests step aside, overflow (HTTP 400 or `response.failed`) is
retried compacted, and the proxy's own compaction items are expanded while OpenAI's pass."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from proxy.fakes.responses import FakeResponses
from proxy.ops import reasons
from proxy.protocols.responses import items as responses_items
from proxy.protocols.responses import protocol as responses_protocol
from proxy.protocols.responses.stream import ResponsesEventChecker
from support.client import sync_openai_client
from support.protocols import compaction_input

MODEL = "gpt-5"
WINDOW = 6000


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def assistant(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def call(cid: str, cmd: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": cid, "name": "shell", "arguments": json.dumps({"cmd": cmd})}


def output(cid: str, text: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": cid, "output": text}


SHELL = {"type": "function", "name": "shell", "description": "Run a command.",
         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
DEVELOPER = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Work in /srv/app."}]}


def history(turns: int, words: int = 120) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [DEVELOPER]
    for t in range(turns):
        items.append(user(f"Step {t}: look at module_{t}.py for TICKET-{4000 + t}. " + " ".join(
            f"word{t}_{i}" for i in range(words))))
        items.append(call(f"call_{t}", f"cat module_{t}.py"))
        items.append(output(f"call_{t}", f"def f_{t}():\n    return {t}\n" * 8))
        items.append(assistant(f"module_{t}.py defines f_{t}; it returns {t}."))
    items.append(user("What did module_0.py define?"))
    return items


def settings(**compaction: Any) -> dict[str, Any]:
    return {"models": {MODEL: {"context_window": WINDOW}},
            "compaction": {"prepare_percent": 0, **compaction}, "tool_results": {"enabled": False}}


@pytest.fixture
async def fake():
    async with FakeResponses(window=WINDOW) as f:
        yield f


@pytest.fixture
async def proxy(fake, make_proxy):
    return await make_proxy(fake.base_url, settings())


async def create(client: AsyncOpenAI, **kw: Any) -> tuple[dict[str, str], Any]:
    raw = await client.responses.with_raw_response.create(model=MODEL, **kw)
    return dict(raw.headers), raw.parse()


# ---- plain requests, every form of the client ---------------------------------------------------


async def test_small_requests_in_every_form_pass_unchanged(fake, proxy, client_for):
    fake.reply = "ok then"
    c = client_for(proxy, "sk-test")
    headers, r = await create(c, input="hello")
    assert r.output_text == "ok then" and headers["x-compaction-status"] == "none"
    raw_sent = fake.requests[-1].body
    assert json.loads(raw_sent) == {"model": MODEL, "input": "hello"}  # the client's bytes, as sent
    headers, r = await create(c, input=[DEVELOPER, user("list files")], tools=[SHELL], instructions="Be brief.")
    assert headers["x-compaction-tokens-before"] == headers["x-compaction-tokens-after"]
    fake.reply = {"tool_calls": [{"name": "shell", "arguments": {"cmd": "ls"}}]}
    _, r = await create(c, input=[user("list files")], tools=[SHELL])
    assert r.output[0].type == "function_call" and r.output[0].name == "shell"
    # sync client (in a thread: the proxy runs on this loop)
    fake.reply = "from sync"
    sync = sync_openai_client(proxy, "sk-test")
    r = await asyncio.to_thread(sync.responses.create, model=MODEL, input="hi")
    assert r.output_text == "from sync"


async def test_streaming_is_relayed_event_by_event(fake, proxy, client_for):
    fake.reply = "one two three four"
    stream = await client_for(proxy, "sk-test").responses.create(model=MODEL, input=[user("count")], stream=True)
    events = [e async for e in stream]
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "one two three four"
    assert [e.sequence_number for e in events] == list(range(len(events)))


async def test_a_cut_stream_ends_with_an_error_event(fake, proxy):
    fake.reply, fake.reset_mid_response, fake.fault_times = "one two three four five six", True, 1
    async with aiohttp.ClientSession() as s:
        async with s.post(proxy.base_url + "/responses", json={"model": MODEL, "input": "x", "stream": True},
                          headers={"Authorization": "Bearer sk-test"}) as r:
            text = (await r.read()).decode()
    last = text.strip().split("\n\n")[-1]
    assert last.startswith("event: error\ndata: ")
    assert json.loads(last.split("data: ", 1)[1])["code"] in ("upstream_unreachable", "bad_upstream_response")


# ---- history compaction ------------------------------------------------------------------------


async def test_history_is_summarized_then_reused_byte_for_byte(fake, proxy, client_for):
    c = client_for(proxy, "sk-test")
    items = history(14)
    headers, _ = await create(c, input=items, instructions="You are a careful agent.", tools=[SHELL])
    assert headers["x-compaction-status"] == "summarized"
    assert int(headers["x-compaction-tokens-after"]) < int(headers["x-compaction-tokens-before"])
    first = fake.responses_requests[-1]
    assert first["input"][0] == DEVELOPER  # the leading developer item kept, first
    summary = first["input"][1]
    assert summary["role"] == "user" and "<summary>" in summary["content"][0]["text"]
    assert first["instructions"].startswith("You are a careful agent.") and len(first["instructions"]) > 30
    calls = len(fake.records("summarizer"))  # one summary (folded over windows on this small window)
    assert calls >= 1 and {r.summarizer_kind for r in fake.records("summarizer")} == {"history"}
    # the next request of the conversation carries the same prefix, byte for byte
    items += [assistant("module_0.py defined f_0."), user("And module_1.py?")]
    headers, _ = await create(c, input=items, instructions="You are a careful agent.", tools=[SHELL])
    assert headers["x-compaction-status"] == "reused"
    second = fake.responses_requests[-1]
    assert second["instructions"] == first["instructions"]
    assert second["input"][:len(first["input"])] == first["input"]
    assert fake.requests[-1].body.startswith(fake.records("responses")[-2].body[:len(fake.requests[-1].body) // 2])
    assert len(fake.records("summarizer")) == calls  # no new summary
    assert all(r.status == 200 for r in fake.requests)  # every forwarded request kept its pairs


async def test_stateful_requests_are_forwarded_untouched(fake, proxy, client_for):
    fake.window = 100_000  # the upstream's own history handling is its business: it answers
    c = client_for(proxy, "sk-test")
    _, first = await create(c, input=[user("hello")])
    items = history(14)
    headers, _ = await create(c, input=items, previous_response_id=first.id)
    assert headers["x-compaction-status"] == "none"
    assert fake.responses_requests[-1]["input"] == items
    assert fake.records("summarizer") == []


async def test_whether_a_request_is_stateful_is_read_once(fake, make_proxy, client_for, monkeypatch):
    """`stateful(body)` once a request: `read` takes the parsed Request's verdict (request_of read
    it) instead of asking the body again, small bodies and long ones through the reuse alike. The
    byte search alone is not trusted: a key written with an escape still reads as stateful."""
    calls: list[int] = []
    real = responses_items.stateful

    def counted(body: dict[str, Any]) -> str | None:
        calls.append(1)
        return real(body)

    monkeypatch.setattr(responses_items, "stateful", counted)
    monkeypatch.setattr(responses_protocol, "stateful", counted)
    fake.window = 100_000
    proxy = await make_proxy(fake.base_url, {**settings(), "models": {MODEL: {"context_window": 100_000}}})
    c = client_for(proxy, "sk-test")
    _, first = await create(c, input=[user("hello")])
    items = history(12)
    assert len(json.dumps(items)) > 16 << 10  # read through the reuse
    for turn in (items, [*items, assistant("Done."), user("And module_1.py?")]):
        headers, _ = await create(c, input=turn)
        assert headers["x-compaction-status"] == "none"
    assert len(calls) == 3
    escaped = json.dumps({"model": MODEL, "input": [user("hi")], "previous_response_id": first.id}).replace(
        "previous_response_id", "previous\\u005fresponse_id")
    async with aiohttp.ClientSession() as s:
        async with s.post(proxy.base_url + "/responses", data=escaped, headers={
                "Authorization": "Bearer sk-test", "Content-Type": "application/json"}) as resp:
            assert resp.status == 200 and resp.headers["x-compaction-reason"] == reasons.STATEFUL
    assert fake.responses_requests[-1]["previous_response_id"] == first.id


async def test_a_held_streams_first_events_are_checked_once(fake, proxy, client_for, monkeypatch):
    """A stream whose first events are held back (the request may be over its window, so an
    overflow could still be retried) is relayed by the checker that read them: each is checked
    once, not again by a new checker in the relay."""
    checked: list[str | None] = []
    real = ResponsesEventChecker.check

    def counted(self: ResponsesEventChecker, name: str | None, data: bytes) -> str | None:
        checked.append(name)
        return real(self, name, data)

    monkeypatch.setattr(ResponsesEventChecker, "check", counted)
    fake.reply = "one two three four"
    raw = await client_for(proxy, "sk-test").responses.with_raw_response.create(
        model=MODEL, input=history(7), stream=True)
    tokens = int(raw.headers["x-compaction-tokens-after"])
    assert raw.headers["x-compaction-status"] == "none" and tokens * 2 >= WINDOW  # held: could overflow
    events = [e async for e in raw.parse()]
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "one two three four"
    assert checked.count("response.created") == checked.count("response.in_progress") == 1


async def test_context_management_steps_history_compaction_aside_but_notes_apply(fake, make_proxy, client_for):
    fake.window = 100_000
    proxy = await make_proxy(fake.base_url, {**settings(), "tool_results": {"enabled": True, "threshold_tokens": 200}})
    items = history(14)
    items.insert(-1, call("call_big", "cat big.log"))
    items.insert(-1, output("call_big", "\n".join(f"line {i}: ERROR E{i:04d} in worker_{i % 7}" for i in range(400))))
    headers, _ = await create(client_for(proxy, "sk-test"), input=items,
                              context_management=[{"type": "compaction", "compact_threshold": 100000}])
    assert headers["x-compaction-status"] == "none"
    assert int(headers["x-compaction-tool-results"]) >= 1
    forwarded = fake.responses_requests[-1]["input"]
    assert len(forwarded) == len(items)  # no history summarized
    assert [r.summarizer_kind for r in fake.records("summarizer")] and all(
        r.summarizer_kind == "tool" for r in fake.records("summarizer"))


async def test_an_overflow_is_retried_compacted_over_http_and_in_the_stream(fake, make_proxy, client_for):
    # The proxy believes the window is large; the upstream's is small: its 400 is the signal.
    proxy = await make_proxy(fake.base_url, {**settings(), "models": {MODEL: {"context_window": 12000}}})
    items = history(14)
    headers, r = await create(client_for(proxy, "sk-test"), input=items)
    assert r.status == "completed" and headers["x-compaction-status"] == "summarized"
    assert [x.status for x in fake.records("responses")][:1] == [400]
    fake.overflow_as_failed_event = True
    items2 = history(15)
    stream = await client_for(proxy, "sk-test").responses.create(model=MODEL, input=items2, stream=True)
    events = [e async for e in stream]
    assert [e.type for e in events if e.type.startswith("response.")][0] == "response.created"
    assert events[-1].type == "response.completed"  # the failed attempt never reached the client
    assert not [e for e in events if e.type == "response.failed"]


async def test_a_small_requests_stream_starts_at_once(fake, proxy, client_for):
    """The first events go to the client as they come when the request is well under its window:
    no overflow can follow them, so `response.created` does not wait for the model's first output
    (here 20 s away)."""
    fake.chunk_delay_s = 20

    async def first_event() -> Any:
        stream = await client_for(proxy, "sk-test").responses.create(model=MODEL, input=history(1), stream=True)
        try:
            return await stream.__anext__()
        finally:
            await stream.close()

    event = await asyncio.wait_for(first_event(), 8)
    assert event.type == "response.created"


async def test_a_small_request_failing_for_length_in_the_stream_is_relayed(fake, proxy, client_for):
    """What holding the first events is for cannot happen below half the window (a tokenizer is not
    2x off): an upstream that still fails such a stream for length is answered as it said, once."""
    fake.window, fake.overflow_as_failed_event = 50, True
    stream = await client_for(proxy, "sk-test").responses.create(model=MODEL, input=history(1), stream=True)
    events = [e async for e in stream]
    assert [e.type for e in events][0] == "response.created" and events[-1].type == "response.failed"
    assert events[-1].response.error.code == "context_length_exceeded"
    assert len(fake.records("responses")) == 1


# ---- compaction items --------------------------------------------------------------------------


async def test_our_compaction_item_is_expanded_and_a_foreign_one_passes(make_proxy, client_for):
    async with FakeResponses(window=WINDOW, serve_compact=False) as fake:
        proxy = await make_proxy(fake.base_url, settings())
        c = client_for(proxy, "sk-test")
        compacted = await c.responses.compact(model=MODEL, input=history(3))
        carried = compaction_input(compacted.output)
        headers, r = await create(c, input=[*carried, user("go on")])
        assert r.status == "completed"
        sent = fake.responses_requests[-1]["input"]
        assert not [it for it in sent if it.get("type") == "compaction"]  # the upstream never sees ours
        assert any("<summary>" in json.dumps(it) for it in sent)
        # the same carried item gives the same bytes every time (prompt cache)
        await create(c, input=[*carried, user("go on")])
        assert fake.requests[-1].body == fake.records("responses")[-2].body
    async with FakeResponses(window=WINDOW) as openai_like:
        proxy = await make_proxy(openai_like.base_url, settings())
        c = client_for(proxy, "sk-test")
        theirs = await c.responses.compact(model=MODEL, input=history(3))
        carried = compaction_input(theirs.output)
        _, r = await create(c, input=[*carried, user("go on")])
        assert r.status == "completed"
        assert openai_like.responses_requests[-1]["input"][:len(carried)] == carried  # untouched
