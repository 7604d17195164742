"""The Messages adapter (proxy/protocols/messages/adapter.py) on the neutral model: the recorded
Claude Code session parses and renders back to its bytes, its blocks become the right items,
and every summary it can inject, with the tool notes and breakpoints that go with it, makes a
request the strict fake accepts."""

from __future__ import annotations

import json

import orjson
import pytest

from proxy import jsonbody
from proxy.protocols.messages.adapter import MessagesAdapter
from proxy.fakes.messages import FakeMessages
from proxy.fakes.messages.validate import Context, check_request
from proxy.model import Conversation, Kind
from support.compaction_helpers import counter
from support.flows import make_flow
from support.sessions import FIXTURE_SIGNING_KEY, claude_requests

MESSAGES = MessagesAdapter()


def flow_of(body: dict, dumps=orjson.dumps):
    raw = dumps(body) if dumps is orjson.dumps else dumps(body).encode()
    return make_flow(raw=raw, adapter=MESSAGES, headers={"x-api-key": "sk-ant"}), raw


def strict(body: bytes) -> None:
    fake = FakeMessages(signing_key=FIXTURE_SIGNING_KEY)  # never started: its checks and signer
    check_request(jsonbody.loads(body), Context(signer=fake.signer))


@pytest.mark.parametrize("dumps", [json.dumps, orjson.dumps], ids=["spaced", "compact"])
def test_an_unchanged_request_goes_upstream_as_the_client_wrote_it(dumps):
    for body in claude_requests():
        flow, raw = flow_of(body, dumps)
        assert not flow.changed and flow.body() is raw
        copy = Conversation(list(flow.forwarded.envelopes), list(flow.forwarded.tokens))
        rendered = MESSAGES.render(flow.request, copy)
        assert jsonbody.loads(rendered) == body
        if dumps is orjson.dumps:
            assert rendered == raw


def test_the_model_of_a_messages_conversation():
    body = claude_requests()[5]
    flow, _ = flow_of(body)
    conv = flow.forwarded
    assert conv.n_system == 1 and conv.envelopes[0].text.startswith("You are Claude Code")
    kinds = [[it.kind for it in e.items] for e in conv.envelopes[1:5]]
    assert kinds == [[Kind.USER, Kind.USER], [Kind.OPAQUE, Kind.TOOL_CALL], [Kind.TOOL_RESULT],
                     [Kind.OPAQUE, Kind.ASSISTANT, Kind.TOOL_CALL]]  # thinking is opaque
    call, result = conv.envelopes[2].items[1], conv.envelopes[3].items[0]
    assert call.name == "TodoWrite" and result.call_id == call.call_id
    assert result.name == "TodoWrite" and result.text == "Todos have been modified successfully."
    errored = [it for it in conv.items() if it.kind is Kind.TOOL_RESULT and it.is_error]
    assert len(errored) == 1 and "JE-20931" in errored[0].text
    # cuts: before the first user message never, before a tool_result message never
    assert [e.cut_before for e in conv.envelopes[1:]] == [False, True, False, True, False, True, False, True,
                                                          False, True, False]
    assert [e.turn for e in conv.envelopes[1:]] == [1] * (len(conv) - 1)
    assert flow.report.tokens_before == flow.total() == sum(conv.tokens) + flow.request.tools_tokens + 3


def test_every_injectable_summary_renders_a_request_the_strict_fake_accepts():
    tried = 0
    for body in claude_requests():
        flow, _ = flow_of(body)
        conv = flow.forwarded
        for cut, env in enumerate(conv.envelopes):
            if not env.cut_before:
                continue
            injected = MESSAGES.inject(conv, cut, "## Active Task\nfix LEDGER-4211", "History was compacted.")
            envs = injected.envelopes
            tokens = [MESSAGES.count(e, flow.request.encoding, counter()) for e in envs[:injected.head]]
            fwd = Conversation(envs, tokens + conv.tokens[injected.tail_start:])
            rendered = MESSAGES.render(flow.request, fwd)
            strict(rendered)
            out = jsonbody.loads(rendered)
            plain = [{k: v for k, v in b.items() if k != "cache_control"} for b in out["system"][:2]]
            assert plain == [{k: v for k, v in b.items() if k != "cache_control"} for b in body["system"]]
            assert out["system"][1] == body["system"][1]  # the newest system breakpoint stays
            assert out["system"][2]["text"] == "History was compacted."
            first = out["messages"][0]["content"][0]
            assert first["text"].startswith("## Active Task") and first["cache_control"] == {"type": "ephemeral"}
            n = sum("cache_control" in b for b in out["system"]) + sum(
                "cache_control" in b for m in out["messages"] for b in m["content"] if isinstance(m["content"], list))
            assert n <= 4
            tried += 1
    assert tried > 40


def test_a_tool_note_keeps_id_error_flag_and_the_other_messages_bytes():
    body = claude_requests()[-1]
    flow, raw = flow_of(body)
    conv = flow.forwarded
    i = next(k for k, e in enumerate(conv.envelopes) if any(it.kind is Kind.TOOL_RESULT and it.is_error for it in e.items))
    noted = MESSAGES.with_output(conv.envelopes[i], 0, "[note] ValueError JE-20931")
    flow.forwarded = conv.with_envelopes({i: (noted, MESSAGES.count(noted, flow.request.encoding, counter()))})
    rendered = flow.body()
    strict(rendered)
    out = jsonbody.loads(rendered)
    block = out["messages"][i - 1]["content"][0]
    assert block["is_error"] is True and block["content"] == [{"type": "text", "text": "[note] ValueError JE-20931"}]
    assert block["tool_use_id"] == body["messages"][i - 1]["content"][0]["tool_use_id"]
    others = [m for k, m in enumerate(out["messages"]) if k != i - 1]
    assert others == [m for k, m in enumerate(body["messages"]) if k != i - 1]
    assert b'"system":' + orjson.dumps(body["system"]) in rendered


def test_counts_per_envelope_match_the_parse():
    flow, _ = flow_of(claude_requests()[-1])
    conv = flow.forwarded
    assert [MESSAGES.count(e, flow.request.encoding, counter()) for e in conv.envelopes] == conv.tokens


def test_native_compaction_and_the_protocol_pieces():
    body = {"model": "claude-sonnet-4-6", "max_tokens": 10, "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
            "messages": [{"role": "user", "content": "q"}]}
    flow, _ = flow_of(body)
    assert flow.request.native_compaction and flow.forwarded.n_system == 0
    assert MESSAGES.is_overflow(400, b'{"type":"error","error":{"type":"invalid_request_error",'
                                     b'"message":"prompt is too long: 210000 tokens > 200000 maximum"}}')
    usage = MESSAGES.usage(b'{"usage":{"input_tokens":3,"cache_read_input_tokens":10,"output_tokens":2}}')
    assert (usage.prompt, usage.cached, usage.completion) == (13, 10, 2)


def test_the_summarizer_reads_each_message_by_its_role_and_never_its_thinking():
    """An assistant message that starts with signed thinking is still the assistant's (its text and
    calls are read, the thinking is not); a user message answering calls reads as its results."""
    from proxy.compaction.serialize import serialize_envelopes

    body = claude_requests()[-1]
    conv = flow_of(body)[0].forwarded
    blocks = serialize_envelopes(conv.envelopes[conv.n_system:])
    roles = [m["role"] for m in body["messages"]]
    assert len(blocks) == len(roles) and not any("[Opaque item]" in b for b in blocks)
    for block, m in zip(blocks, body["messages"]):
        types = {b["type"] for b in m["content"]} if isinstance(m["content"], list) else {"text"}
        head = block.split(":", 1)[0]
        assert head == ("[Assistant]" if m["role"] == "assistant" and "text" in types else
                        "[Tool call]" if m["role"] == "assistant" else
                        "[Tool result" if "tool_result" in types else "[User]")
    thinking = [b["thinking"] for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]
                if b["type"] == "thinking"]
    assert thinking and not any(t[:40] in "\n".join(blocks) for t in thinking)
