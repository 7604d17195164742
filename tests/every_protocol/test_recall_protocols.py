"""Recall on every protocol (design.md § Recall, issue 16): the Responses and Messages routes declare and
answer the recall tool as the chat route does, through their real clients (`openai`
responses.create / responses.stream, `anthropic` messages.create / messages.stream) and their
strict fakes, whose fake model looks a planted fact up when its context lacks it
(support/recall_facts.py; the chat route's own tests are tests/recall/test_recall_flow.py).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.prompts import Prompts
from proxy.recall.handles import in_text
from support.recall_facts import NOT_FOUND, build_session
from support.recall_protocols import Driver, driver, other_client
from support.redis_server import RedisServer, redis_server_fixture

ADAPTERS = ("responses", "responses-ws", "messages")  # responses-ws: one WebSocket, every answer streamed
ALL = ("chat", "responses", "messages")


def carries_handle(d: Driver, body: dict[str, Any]) -> bool:
    return any(in_text(str(m.get("content") or "")) for m in d.chat_form(body)["messages"])


@pytest.mark.parametrize("protocol", ADAPTERS)
async def test_planted_facts_from_compacted_spans_are_answered_exactly(protocol: str, tmp_path) -> None:
    async with driver(protocol, {"store": {"url": f"sqlite:///{tmp_path}/store.db"}}) as d:
        history, facts = build_session()
        await d.play(history)
        stats = d.stats
        assert stats["events_summarized"] >= 2 and stats["events_masked"] >= 1, dict(stats)
        for stream in (True,) if protocol == "responses-ws" else (False, True):
            d.fake.clear_requests()
            right, via_recall = 0, 0
            for f in facts:
                before = len(d.requests)
                answer = await d.ask(history, f.question(), stream=stream)
                rounds = len(d.requests) - before
                right += f.text in answer and answer != NOT_FOUND
                via_recall += rounds > 1 and "recalled original" in answer
            assert right >= 29, (protocol, stream, right)
            # the facts come from compacted spans: most are answered through the tool, not from context
            assert via_recall >= 20, (protocol, stream, via_recall)


@pytest.mark.parametrize("protocol", ADAPTERS)
async def test_the_tool_is_declared_with_the_same_bytes_once_compacted_and_never_before(protocol: str) -> None:
    async with driver(protocol) as d:
        history, _ = build_session(turns=40, facts_per_kind=(3, 3, 3, 3))
        await d.play(history[:13])  # a few turns: nothing compacted yet
        assert d.requests and not any(d.recall_tools(b) for b in d.requests)
        await d.play(history)
        declared = [orjson.dumps(d.recall_tools(b)) for b in d.requests if d.recall_tools(b)]
        assert declared and len(set(declared)) == 1
        first = next(i for i, b in enumerate(d.requests) if d.recall_tools(b))
        carries = [carries_handle(d, b) for b in d.requests]
        assert first == carries.index(True) and all(d.recall_tools(b) for b in d.requests[first:])
        # the client's own tools keep their bytes, in front
        client_tools = d.requests[0]["tools"]
        assert all(b["tools"][:len(client_tools)] == client_tools for b in d.requests)
        # an answer that calls no recall shows no trace of the tool either (Responses echoes `tools`)
        for stream in (False, True):
            a = await d.send([*history, {"role": "user", "content": "go on"}], stream=stream)
            assert d.recall_tools(d.requests[-1]) and b"context_recall" not in orjson.dumps(a.raw.model_dump())


@pytest.mark.parametrize("protocol", ADAPTERS)
async def test_recall_disabled_declares_nothing(protocol: str) -> None:
    async with driver(protocol, {"recall": {"enabled": False}}) as d:
        history, _ = build_session(turns=40, facts_per_kind=(3, 3, 3, 3))
        await d.play(history)
        stats = d.stats
        assert stats["events_summarized"] + stats["events_masked"] >= 1
        assert not any(d.recall_tools(b) for b in d.requests)
        # no summary names spans nobody keeps
        assert not any("## Recall" in str(d.chat_form(b)["messages"]) for b in d.requests)


def recall_name(body: dict[str, Any]) -> str | None:
    return next((t["function"]["name"] for t in body.get("tools") or ()
                 if t["function"]["name"].startswith("context_recall")), None)


def forever(body: dict[str, Any]) -> Any:
    """A model that calls the recall tool whenever it can (chat form)."""
    name = recall_name(body)
    if name is None or body.get("tool_choice") == "none":
        return "no tool" if name is None else "stopped"
    return {"content": None, "tool_calls": [{"name": name, "arguments": {"query": "anything"}}]}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("protocol", ADAPTERS)
async def test_max_rounds_holds_against_a_model_that_calls_forever(protocol: str, stream: bool) -> None:
    async with driver(protocol, {"recall": {"max_rounds": 2}}) as d:
        history, _ = build_session(turns=40, facts_per_kind=(3, 3, 3, 3))
        await d.play(history)
        d.set_reply(lambda b: {"content": None, "tool_calls": [
            {"name": recall_name(b), "arguments": {"query": "anything"}}]} if recall_name(b) else "no tool")
        d.fake.clear_requests()
        a = await d.send([*history, {"role": "user", "content": "look it up"}], stream=stream)
        assert not a.calls
        # the first ask, two rounds, one told there are no more (the protocol's "no tool" choice)
        assert len(d.requests) == 4
        last = d.requests[-1]
        assert last["tool_choice"] == ("none" if d.family == "responses" else {"type": "none"})
        assert "No more lookups" in str(d.chat_form(last)["messages"][-1]["content"])
        assert a.stop == ("completed" if d.family == "responses" else "end_turn")
        # (a Messages stream's headers go out with its message_start, before any lookup: the count
        # ends the stream as a comment, tests/recall/test_recall_streams.py)
        assert a.headers["x-compaction-recalls"] == ("0" if protocol == "messages" and stream else "3")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("protocol", ADAPTERS)
async def test_a_turn_with_recall_and_a_client_call_gives_the_client_its_calls_only(protocol: str,
                                                                                     stream: bool) -> None:
    def mixed(body: dict[str, Any]) -> Any:
        last = body["messages"][-1]
        if last["role"] == "tool":
            return f"read it: {last['content']}"
        return {"content": "Looking.", "reasoning": "Two things to do.", "thinking": "Two things to do.", "tool_calls": [{"name": recall_name(body), "arguments": {"query": "segment"}},
                                                       {"name": "read_file", "arguments": {"path": "a.py"}}]}

    async with driver(protocol) as d:
        history, _ = build_session(turns=40, facts_per_kind=(3, 3, 3, 3))
        await d.play(history)
        d.set_reply(mixed)
        if protocol == "messages":
            d.extra = {"thinking": {"type": "enabled", "budget_tokens": 1024}}  # signed thinking kept for the turn after
        elif d.family == "responses":
            d.extra = {"include": ["reasoning.encrypted_content"]}
        d.fake.clear_requests()
        messages = [*history, {"role": "user", "content": "read a.py"}]
        a = await d.send(messages, stream=stream)
        assert [c["name"] for c in a.calls] == ["read_file"] and a.calls[0]["arguments"] == {"path": "a.py"}
        assert a.text == "Looking." and len(d.requests) == 1  # the recall call was not answered
        assert a.stop == ("completed" if d.family == "responses" else "tool_use")
        assert b"context_recall" not in orjson.dumps(a.raw.model_dump())
        # the client answers its own call and goes on: a valid conversation for the strict upstream
        follow = await d.send_after(messages, a, "print('a')")
        assert follow.text == "read it: print('a')"
        assert "context_recall" not in str(d.chat_form(d.requests[-1])["messages"])


async def test_each_protocols_declaration_has_its_shape() -> None:
    for protocol, keys in (("responses", {"type", "name", "description", "parameters", "strict"}),
                           ("messages", {"name", "description", "input_schema"})):
        async with driver(protocol) as d:
            history, _ = build_session(turns=40, facts_per_kind=(3, 3, 3, 3))
            await d.play(history)
            tool = next(d.recall_tools(b) for b in d.requests if d.recall_tools(b))[0]
            assert set(tool) == keys and tool["name"] == "context_recall", tool



async def test_a_response_chained_from_a_streamed_recall_answer_is_a_valid_conversation() -> None:
    """The streamed answer shows the first round's id; the response stored with the whole turn is
    the last round's. A request chaining from the shown id goes on from the stored one."""
    async with driver("responses") as d:
        history, facts = build_session(turns=40, facts_per_kind=(3, 3, 3, 3))
        await d.play(history)
        d.fake.clear_requests()
        fact = facts[0]
        a = await d.send([*history, {"role": "user", "content": fact.question()}], stream=True)
        assert len(d.requests) == 2 and fact.text in a.text  # answered through one recall round
        shown = a.raw.id
        r = await d.client.responses.create(model="m", previous_response_id=shown,
                                            input=[{"role": "user", "content": "thanks"}])
        assert r.status == "completed"
        assert d.requests[-1]["previous_response_id"] != shown  # chained from the stored turn


@pytest.mark.parametrize("protocol", ADAPTERS)
async def test_one_credential_never_recalls_anothers_originals(protocol: str) -> None:
    """Bob's model guesses every handle of Alice's and searches for her fact: it finds nothing."""
    async with driver(protocol, key="sk-alice") as alice, other_client(alice, "sk-bob") as bob:
        history, facts = build_session(turns=40, facts_per_kind=(3, 3, 3, 3))
        await alice.play(history)
        handles = sorted({h for b in alice.requests for m in alice.chat_form(b)["messages"]
                          for h in in_text(str(m.get("content") or ""))})
        assert handles
        fact = next(f for f in facts if f.kind == "error")
        bob_history, _ = build_session(turns=40, seed=99, facts_per_kind=(3, 3, 3, 3))
        await bob.play(bob_history)  # bob's own compacted conversation: the tool is declared for him

        def guesses(body: dict[str, Any]) -> Any:
            if body["messages"][-1]["role"] == "tool":
                return "done: " + "\n".join(str(m["content"]) for m in body["messages"] if m["role"] == "tool")
            name = recall_name(body)
            return {"content": None, "tool_calls": [{"name": name, "arguments": {"handle": h}} for h in handles]
                    + [{"name": name, "arguments": {"query": fact.key}}]}

        bob.set_reply(guesses)
        out = (await bob.send([*bob_history, {"role": "user", "content": "go"}])).text
        assert out.startswith("done:") and fact.text not in out
        assert out.count("No original has the recall id") == len(handles)


outage_redis = redis_server_fixture("outage_redis")


@pytest.mark.redis
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("protocol", ADAPTERS)
async def test_a_store_outage_makes_the_tool_answer_unavailable(protocol: str, stream: bool,
                                                               outage_redis: RedisServer) -> None:
    async with driver(protocol, {"store": {"url": outage_redis.url}}) as d:
        history, facts = build_session(turns=40, facts_per_kind=(3, 3, 3, 3))
        await d.play(history)
        outage_redis.stop()
        d.fake.clear_requests()
        answer = await d.ask(history, facts[0].question(), stream=stream)
        assert answer == NOT_FOUND  # an ordinary answer: the request did not fail
        results = [m for m in d.chat_form(d.requests[-1])["messages"] if m["role"] == "tool"]
        assert results[-1]["content"] == Prompts().text("recall-unavailable")
