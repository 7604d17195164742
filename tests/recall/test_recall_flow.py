"""Recall through the real proxy (design.md § Recall), with the real `openai` client and a strict fake
upstream: planted facts from compacted spans answered exactly, the declaration's bytes, isolation
between credentials, the round limit, a store outage, and a turn that mixes recall and client calls.
"""

from __future__ import annotations

from typing import Any

import openai
import orjson
import pytest

from proxy.fakes.chat import FakeUpstream
from proxy.fakes.chat.replies import content_text
from proxy.prompts import Prompts
from proxy.recall import answers
from proxy.recall.handles import in_text
from support.client import openai_client
from support.proxy_server import start_proxy
from support.redis_server import RedisServer, redis_server_fixture
from support.recall_facts import NOT_FOUND, TOOLS, build_session, model_reply

WINDOW = 24000
SETTINGS = {
    "models": {"default": {"context_window": WINDOW}},
    "compaction": {"threshold_tokens": 12000, "keep_recent_tokens": 3000, "prepare_percent": 0},
}


def recall_tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in body.get("tools") or () if t["function"]["name"].startswith("context_recall")]


async def play(client: openai.AsyncOpenAI, messages: list[dict[str, Any]]) -> None:
    """Replay the scripted session: one request each time the client would ask the model."""
    for i in range(2, len(messages) + 1):
        if messages[i - 1]["role"] == "tool":
            await client.chat.completions.create(model="m", messages=messages[:i], tools=TOOLS)


async def ask(client: openai.AsyncOpenAI, history: list[dict[str, Any]], question: str, *, stream: bool) -> str:
    messages = [*history, {"role": "user", "content": question}]
    if not stream:
        r = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        assert r.choices[0].message.tool_calls is None
        return r.choices[0].message.content or ""
    parts = []
    s = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True,
                                             stream_options={"include_usage": True})
    async for chunk in s:
        for c in chunk.choices:
            assert not c.delta.tool_calls
            parts.append(c.delta.content or "")
    return "".join(parts)


@pytest.fixture
async def fake():
    async with FakeUpstream(reply=model_reply, window=WINDOW) as f:
        yield f


async def test_planted_facts_from_compacted_spans_are_answered_exactly(fake: FakeUpstream, tmp_path) -> None:
    proxy = await start_proxy(fake.base_url, {**SETTINGS, "store": {"url": f"sqlite:///{tmp_path}/store.db"}})
    client = openai_client(proxy, "sk-recall")
    try:
        history, facts = build_session()
        await play(client, history)
        stats = proxy.state.compaction.stats
        assert stats["events_summarized"] >= 2 and stats["events_masked"] >= 1, dict(stats)
        for stream in (False, True):
            fake.clear_requests()
            right, via_recall = 0, 0
            for f in facts:
                before = len(fake.chat_requests)
                answer = await ask(client, history, f.question(), stream=stream)
                rounds = len(fake.chat_requests) - before
                right += f.text in answer and answer != NOT_FOUND
                via_recall += rounds > 1 and "recalled original" in answer
            assert right >= 29, (stream, right)
            # the facts come from compacted spans: most are answered through the tool, not from context
            assert via_recall >= 20, (stream, via_recall)
    finally:
        await client.close()
        await proxy.close()


async def test_the_tool_is_declared_with_the_same_bytes_once_compacted_and_never_before(fake: FakeUpstream) -> None:
    proxy = await start_proxy(fake.base_url, SETTINGS)
    client = openai_client(proxy, "sk-decl")
    try:
        history, _ = build_session(turns=40, facts_per_kind=(3, 3, 3, 3))
        await play(client, history[:13])  # a few turns: nothing compacted yet
        assert fake.chat_requests and not any(recall_tools(b) for b in fake.chat_requests)
        await play(client, history)
        declared = [orjson.dumps(recall_tools(b)) for b in fake.chat_requests if recall_tools(b)]
        assert declared and len(set(declared)) == 1
        first = next(i for i, b in enumerate(fake.chat_requests) if recall_tools(b))
        # from the first request carrying a replacement on, every request declares it
        carries = [bool(in_text(" ".join(content_text(m.get("content")) for m in b["messages"])))
                   for b in fake.chat_requests]
        assert first == carries.index(True) and all(recall_tools(b) for b in fake.chat_requests[first:])
        # the client's own tools keep their bytes, in front
        assert all(b["tools"][:len(TOOLS)] == TOOLS for b in fake.chat_requests)
    finally:
        await client.close()
        await proxy.close()


async def test_recall_disabled_declares_nothing(fake: FakeUpstream) -> None:
    proxy = await start_proxy(fake.base_url, {**SETTINGS, "recall": {"enabled": False}})
    client = openai_client(proxy, "sk-off")
    try:
        history, _ = build_session(turns=40, facts_per_kind=(3, 3, 3, 3))
        await play(client, history)
        assert proxy.state.compaction.stats["events_summarized"] + proxy.state.compaction.stats["events_masked"] >= 1
        assert not any(recall_tools(b) for b in fake.chat_requests)
    finally:
        await client.close()
        await proxy.close()


async def test_one_credential_never_recalls_anothers_originals(fake: FakeUpstream) -> None:
    proxy = await start_proxy(fake.base_url, SETTINGS)
    alice = openai_client(proxy, "sk-alice")
    bob = openai_client(proxy, "sk-bob")
    try:
        history, facts = build_session(turns=40, facts_per_kind=(3, 3, 3, 3))
        await play(alice, history)
        handles = sorted({h for b in fake.chat_requests for m in b["messages"] for h in in_text(content_text(m.get("content")))})
        assert handles
        fact = next(f for f in facts if f.kind == "error")

        def bob_reply(body: dict[str, Any]) -> Any:
            # bob's model guesses alice's handles and searches for her fact
            if body["messages"][-1]["role"] == "tool":
                return "done: " + "\n".join(content_text(m.get("content")) for m in body["messages"] if m["role"] == "tool")
            name = recall_tools(body)[0]["function"]["name"] if recall_tools(body) else None
            if name is None:
                return "no tool"
            return {"content": None, "tool_calls": [{"name": name, "arguments": {"handle": h}} for h in handles]
                    + [{"name": name, "arguments": {"query": fact.key}}]}

        fake.reply = bob_reply
        bob_history, _ = build_session(turns=40, seed=99, facts_per_kind=(3, 3, 3, 3))  # bob's own compacted conversation
        fake.reply = model_reply
        await play(bob, bob_history)
        fake.reply = bob_reply
        r = await bob.chat.completions.create(model="m", messages=[*bob_history, {"role": "user", "content": "go"}])
        out = r.choices[0].message.content or ""
        assert out.startswith("done:") and fact.text not in out
        # every one of alice's handles, guessed right, finds nothing for bob
        assert out.count("No original has the recall id") == len(handles)
        assert not any(f"recall id {h} ·" in out for h in handles)
    finally:
        await alice.close()
        await bob.close()
        await proxy.close()


def forever(body: dict[str, Any]) -> Any:
    """A model that calls the recall tool whenever it can."""
    tools = recall_tools(body)
    if not tools:
        return "no tool"
    return {"content": None, "tool_calls": [{"name": tools[0]["function"]["name"], "arguments": {"query": "anything"}}]}


@pytest.mark.parametrize("stream", [False, True])
async def test_max_rounds_holds_against_a_model_that_calls_forever(fake: FakeUpstream, stream: bool) -> None:
    proxy = await start_proxy(fake.base_url, {**SETTINGS, "recall": {"max_rounds": 2}})
    client = openai_client(proxy, "sk-forever")
    try:
        history, _ = build_session(turns=40, facts_per_kind=(3, 3, 3, 3))
        await play(client, history)
        fake.reply = forever
        fake.clear_requests()
        messages = [*history, {"role": "user", "content": "look it up"}]
        if stream:
            raw = await client.chat.completions.with_raw_response.create(model="m", messages=messages, tools=TOOLS,
                                                                         stream=True)
            chunks = [c async for c in raw.parse()]
            assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
            headers = raw.headers
        else:
            raw = await client.chat.completions.with_raw_response.create(model="m", messages=messages, tools=TOOLS)
            r = raw.parse()
            assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "stop"
            headers = raw.headers
        # the first ask, two rounds, one told there are no more (with tool_choice none), then it stops
        assert len(fake.chat_requests) == 4
        assert fake.chat_requests[-1]["tool_choice"] == "none"
        assert "No more lookups" in content_text(fake.chat_requests[-1]["messages"][-1]["content"])
        assert headers["x-compaction-recalls"] == "3"
    finally:
        await client.close()
        await proxy.close()


outage_redis = redis_server_fixture("outage_redis")


@pytest.mark.redis
@pytest.mark.parametrize("stream", [False, True])
async def test_a_store_outage_makes_the_tool_answer_unavailable(fake: FakeUpstream, outage_redis: RedisServer,
                                                               stream: bool) -> None:
    proxy = await start_proxy(fake.base_url, {**SETTINGS, "store": {"url": outage_redis.url}})
    client = openai_client(proxy, "sk-outage")
    try:
        history, facts = build_session(turns=40, facts_per_kind=(3, 3, 3, 3))
        await play(client, history)
        outage_redis.stop()
        fake.clear_requests()
        fact = facts[0]
        answer = await ask(client, history, fact.question(), stream=stream)
        assert answer == NOT_FOUND  # an ordinary answer: the request did not fail
        tool_results = [m for m in fake.chat_requests[-1]["messages"] if m["role"] == "tool"]
        assert tool_results[-1]["content"] == Prompts().text("recall-unavailable")
    finally:
        await client.close()
        await proxy.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_a_turn_with_recall_and_a_client_call_gives_the_client_its_calls_only(fake: FakeUpstream,
                                                                                     stream: bool) -> None:
    proxy = await start_proxy(fake.base_url, SETTINGS)
    client = openai_client(proxy, "sk-mixed")

    def mixed(body: dict[str, Any]) -> Any:
        last = body["messages"][-1]
        if last["role"] == "tool":
            return f"read it: {content_text(last['content'])}"
        name = recall_tools(body)[0]["function"]["name"]
        return {"content": "Looking.", "tool_calls": [{"name": name, "arguments": {"query": "segment"}},
                                                       {"name": "read_file", "arguments": {"path": "a.py"}}]}

    try:
        history, _ = build_session(turns=40, facts_per_kind=(3, 3, 3, 3))
        await play(client, history)
        fake.reply = mixed
        fake.clear_requests()
        messages = [*history, {"role": "user", "content": "read a.py"}]
        if stream:
            s = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True)
            text, calls, finish = "", {}, None
            async for chunk in s:
                d = chunk.choices[0].delta if chunk.choices else None
                if d is None:
                    continue
                text += d.content or ""
                for tc in d.tool_calls or ():
                    c = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                    c["id"] = tc.id or c["id"]
                    c["name"] += (tc.function.name or "") if tc.function else ""
                    c["arguments"] += (tc.function.arguments or "") if tc.function else ""
                finish = chunk.choices[0].finish_reason or finish
            assert list(calls) == [0] and finish == "tool_calls"
            call = calls[0]
            assistant = {"role": "assistant", "content": text, "tool_calls": [
                {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]}
        else:
            r = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
            msg = r.choices[0].message
            assert r.choices[0].finish_reason == "tool_calls" and len(msg.tool_calls) == 1
            call = {"id": msg.tool_calls[0].id, "name": msg.tool_calls[0].function.name,
                    "arguments": msg.tool_calls[0].function.arguments}
            assistant = msg.model_dump(exclude_none=True)
            text = msg.content or ""
        assert call["name"] == "read_file" and orjson.loads(call["arguments"]) == {"path": "a.py"}
        assert text == "Looking." and len(fake.chat_requests) == 1  # the recall call was not answered
        # the client answers its own call and goes on: a valid conversation for the strict upstream
        follow = [*messages, assistant, {"role": "tool", "tool_call_id": call["id"], "content": "print('a')"}]
        r2 = await client.chat.completions.create(model="m", messages=follow, tools=TOOLS)
        assert r2.choices[0].message.content == "read it: print('a')"
        assert not any(tc["function"]["name"].startswith("context_recall")
                       for m in fake.chat_requests[-1]["messages"] for tc in m.get("tool_calls") or ())
    finally:
        await client.close()
        await proxy.close()


async def test_the_forwarded_body_is_parsed_only_when_a_recall_round_continues_it(fake: FakeUpstream,
                                                                                  monkeypatch) -> None:
    """Every compacted request's answer goes through the recall layer; only an answer that calls
    the recall tool needs the forwarded body (the whole history) as a dict to continue it. Over a
    compacted session whose answers call no recall, nothing is parsed; a question answered through
    recall parses its request's body once, whole or streamed."""
    parses: list[int] = []  # the forwarded bodies parsed, by their size
    monkeypatch.setattr(answers, "sent_loads", lambda data, real=answers.sent_loads: parses.append(len(data)) or real(data))
    proxy = await start_proxy(fake.base_url, SETTINGS)
    client = openai_client(proxy, "sk-recall")
    try:
        history, facts = build_session(turns=40, facts_per_kind=(3, 3, 3, 3))
        await play(client, history)
        assert proxy.state.compaction.stats["events_summarized"] >= 1
        assert parses == []  # dozens of compacted requests, each relayed through the recall layer
        for stream in (False, True):
            before = len(fake.chat_requests)
            answer = await ask(client, history, facts[0].question(), stream=stream)
            assert "recalled original" in answer and len(fake.chat_requests) - before == 2
            assert len(parses) == 1 + stream
    finally:
        await client.close()
        await proxy.close()
