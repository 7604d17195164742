"""The chat adapter and the neutral model (issue 13): the shared fixtures parse and render back to
the client's bytes when nothing changed, each message is written to JSON once per request, and the
model says what the stages need (kinds, call ids and names, cut points, turns) with no field name."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import jsonbody
from proxy.adapter import Request
from proxy.model import Conversation, Kind
from support.coding_session import coding_session
from support.conversations import tau_conversations
from support.flows import CHAT, make_flow
from support.transcripts import swe_agent_messages


def fixtures(fixtures_dir) -> dict[str, list[dict[str, Any]]]:
    out = {f"tau-{i}": traj for i, traj in enumerate(tau_conversations(fixtures_dir, 3))}
    out["swe-agent"] = swe_agent_messages(fixtures_dir / "swe-agent/marshmallow-1867.function_calling.traj")
    out["coding-session"] = coding_session(6).messages
    return out


@pytest.mark.parametrize("dumps", [json.dumps, orjson.dumps], ids=["spaced", "compact"])
def test_unchanged_fixtures_go_upstream_as_the_client_wrote_them(fixtures_dir, dumps):
    for name, messages in fixtures(fixtures_dir).items():
        body = {"model": "gpt-4o", "messages": messages, "temperature": 0.2, "tools": coding_session(1).tools}
        raw = dumps(body) if dumps is orjson.dumps else dumps(body).encode()
        flow = make_flow(raw=raw)
        assert not flow.changed and flow.body() is raw, name
        # Rendered envelope by envelope (what a rewrite does with the messages it keeps): the same
        # JSON, and the client's very bytes when it wrote compact JSON.
        copy = Conversation(list(flow.forwarded.envelopes), list(flow.forwarded.tokens))
        rendered = CHAT.render(flow.request, copy)
        assert jsonbody.loads(rendered) == body, name
        if dumps is orjson.dumps:
            assert rendered == raw, name


def test_each_message_is_written_once_per_request(fixtures_dir, monkeypatch):
    messages = fixtures(fixtures_dir)["swe-agent"]
    written: Counter[int] = Counter()
    real = jsonbody.dumps

    def counting(value: Any, **kw: Any) -> bytes:
        written[id(value)] += 1
        return real(value, **kw)

    monkeypatch.setattr(jsonbody, "dumps", counting)
    raw = orjson.dumps({"model": "gpt-4o", "messages": messages})
    flow = make_flow(raw=raw)
    # An edit: the first tool result replaced by a note, rendered with the rest kept.
    conv = flow.forwarded
    i = next(k for k, e in enumerate(conv.envelopes) if e.result is not None)
    note = CHAT.with_output(conv.envelopes[i], 0, "[Summary of bash output]\nshort")
    flow.forwarded = conv.with_envelopes({i: (note, 10)})
    body = flow.body()
    client_messages = flow.request.body["messages"]
    assert [written[id(m)] for m in client_messages] == [1] * len(client_messages)
    forwarded = jsonbody.loads(body)["messages"]
    assert forwarded[i]["content"] == "[Summary of bash output]\nshort"
    assert forwarded[:i] + forwarded[i + 1:] == messages[:i] + messages[i + 1:]


def test_the_model_of_a_chat_conversation():
    call = {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}
    flow = make_flow([
        {"role": "system", "content": "be brief"},
        {"role": "developer", "content": [{"type": "text", "text": "and exact"}]},
        {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "x"}}]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "print(1)"},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "thanks"},
    ])
    conv = flow.forwarded
    assert conv.n_system == 2
    assert [e.kind for e in conv.envelopes] == [Kind.SYSTEM, Kind.SYSTEM, Kind.USER, Kind.ASSISTANT,
                                                 Kind.TOOL_RESULT, Kind.ASSISTANT, Kind.USER]
    assert [e.cut_before for e in conv.envelopes] == [False, False, True, True, False, True, True]
    assert [e.turn for e in conv.envelopes] == [0, 0, 1, 1, 1, 1, 2]
    assistant = conv.envelopes[3]
    assert [(it.kind, it.call_id, it.name, it.args) for it in assistant.items] == [
        (Kind.ASSISTANT, None, None, ""), (Kind.TOOL_CALL, "c1", "read_file", '{"path": "a.py"}')]
    result = conv.envelopes[4].result
    assert result is not None and (result.call_id, result.name, result.text, result.plain) == (
        "c1", "read_file", "print(1)", True)
    assert conv.envelopes[2].text == "look\n[image]" and not conv.envelopes[2].items[0].plain
    assert flow.report.tokens_before == flow.total() == sum(conv.tokens) + 3


def test_a_reused_call_id_names_the_result_after_the_latest_call_before_it():
    def call(name: str) -> dict[str, Any]:
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": "same", "type": "function", "function": {"name": name, "arguments": "{}"}}]}

    flow = make_flow([{"role": "user", "content": "go"}, call("first"), {"role": "tool", "tool_call_id": "same", "content": "1"},
                      call("second"), {"role": "tool", "tool_call_id": "same", "content": "2"}])
    names = [e.result.name for e in flow.forwarded.envelopes if e.result is not None]
    assert names == ["first", "second"]


def test_injecting_a_summary_merges_it_into_a_kept_user_message():
    flow = make_flow([{"role": "system", "content": "sys"}, {"role": "user", "content": "old"},
                      {"role": "assistant", "content": "old answer"}, {"role": "user", "content": "new"}])
    injected = CHAT.inject(flow.forwarded, 3, "SUMMARY", "NOTE")
    assert [e.value for e in injected.envelopes] == [
        {"role": "system", "content": "sys\n\nNOTE"}, {"role": "user", "content": "SUMMARY\n\nnew"}]
    assert (injected.head, injected.tail_start) == (2, 4)
    kept_assistant = CHAT.inject(flow.forwarded, 2, "SUMMARY", "NOTE")
    assert [e.kind for e in kept_assistant.envelopes] == [Kind.SYSTEM, Kind.USER, Kind.ASSISTANT, Kind.USER]
    assert kept_assistant.envelopes[2] is flow.forwarded.envelopes[2] and kept_assistant.tail_start == 2


async def test_a_compacting_request_writes_each_message_once_when_seen_before(monkeypatch):
    """Parse writes each message once (keys, counts and the rendered body reuse those bytes); the
    stable digests of the store keys add one canonical write per message the process never saw."""
    from proxy.compaction.engine import CompactionEngine
    from proxy.compaction.stage import CompactionStage
    from proxy.compaction.summarizer import HistorySummarizer
    from proxy.config import Config
    from proxy.flow import run_request
    from proxy.ops.hooks import Hooks
    from proxy.prompts import Prompts
    from proxy.store.memory import MemoryStore
    from support.compaction_helpers import chat_history, counter, main_summary

    class Summaries:
        async def complete(self, *_: Any, **__: Any) -> str:
            return main_summary("x")

    cfg = Config.model_validate({"models": {"gpt-4": {"context_window": 6000}},
                                 "compaction": {"prepare_percent": 0, "cached_summary_call": False}})
    prompts = Prompts()
    engine = CompactionEngine(cfg, MemoryStore(ttl_s=60, max_records=100),
                              HistorySummarizer(Summaries(), prompts, lambda t: counter().count_text(t, "cl100k_base")),
                              counter(), prompts)
    stages = [CompactionStage(engine, Hooks())]
    written: Counter[int] = Counter()
    real = jsonbody.dumps

    def counting(value: Any, **kw: Any) -> bytes:
        written[id(value)] += 1
        return real(value, **kw)

    monkeypatch.setattr(jsonbody, "dumps", counting)
    history = chat_history(14, 150, system="written once " + str(id(written)))  # new to this process
    for n, (messages, most) in enumerate([(history, 2), ([*history, {"role": "assistant", "content": "ok"},
                                                         {"role": "user", "content": "next"}], 1)]):
        written.clear()
        flow = make_flow(messages, cfg=cfg)
        await run_request(stages, flow)
        flow.body()
        assert flow.report.status == ("summarized" if n == 0 else "reused")
        seen = flow.request.body["messages"][: len(history)]
        assert max(written[id(m)] for m in seen) == most, n


class _Held:
    """A request's share of what Request.positions reads: its items, its previous request, `shared`."""

    def __init__(self, items: list[object], previous: "_Held | None") -> None:
        self.conversation = type("C", (), {"envelopes": items, "values": items})()
        self.previous, self.shared = previous, 0

    positions = Request.positions
    before = Request.before
    owner = Request.owner


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 3), st.integers(0, 6)), min_size=1, max_size=12))
def test_a_position_extended_from_the_previous_requests_is_the_plain_lookup(steps):
    """Each request grows, rewrites or branches from an earlier one (sharing a prefix of its
    objects, one moved or replaced); every lookup, of the request's own objects and of others', is the
    plain index of the request's own items, whichever requests extended the index before."""
    pool = [object() for _ in range(40)]
    made: list[_Held] = []
    for back, moved, grown in steps:
        base = made[-1 - back % len(made)] if made else None
        items = list(base.conversation.envelopes) if base else []
        if moved % 2 and items:  # an item of the shared part put elsewhere (another branch's layout)
            items.append(items.pop(moved % len(items)))
        elif moved and items:  # one rewritten (the client edited its history)
            items[moved % len(items)] = object()
        drawn = [pool[(len(made) * 7 + k) % len(pool)] for k in range(grown)]
        items += [x for x in drawn if x not in items] + [object()]  # (a request's items: distinct objects)
        made.append(_Held(items, base))
    for req in made:
        plain = {id(x): i for i, x in enumerate(req.conversation.envelopes)}
        for x in pool + [y for r in made for y in r.conversation.envelopes]:
            assert req.positions()(x) == plain.get(id(x))
