"""Compaction under preserved thinking (design.md § Messages API): on models that bind a thinking block to its
prefix, the proxy's summary and stubs change the prefix of the kept turns' thinking. The strict
fake (proxy/fakes/messages/binding.py) answers a stale block with the API's 400; through the proxy
a long tool-using session with thinking on never gets one, the thinking made before a change is
left out of the kept turns, and the thinking made after it is forwarded, and stays valid."""

from __future__ import annotations

from typing import Any

import anthropic
import orjson
import pytest

from proxy.protocols.messages import binding
from proxy.compaction.record import SummaryRecord
from proxy.fakes.messages import FakeMessages
from proxy.fakes.messages.binding import BETA
from support.client import anthropic_client
from support.compaction_helpers import filler
from test_recall_streams import metric

MODEL = "claude-fable-5-1"
KEY = "sk-ant-bound"
READ = {"name": "Read", "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
SYSTEM = [{"type": "text", "text": "You are a coding agent. " + filler(40, 99), "cache_control": {"type": "ephemeral"}}]


@pytest.fixture
async def fake():
    async with FakeMessages() as f:
        yield f


def thinking_in(msg: dict[str, Any]) -> list[str]:
    return [b["thinking"] for b in msg["content"] if isinstance(b, dict) and b.get("type") == "thinking"]


async def session(proxy: Any, fake: FakeMessages, steps: int, tool_words: int = 300, model: str = MODEL,
                  history: bool = False) -> Any:
    """A tool loop: every turn thinks ("step N") and reads a file; returns the statuses (or, with
    `history`, the messages)."""
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Fix the bug in a.py. " + filler(60, 1)}]
    statuses = []
    async with anthropic_client(proxy, KEY) as c:
        for step in range(steps):
            fake.reply = {"thinking": f"step {step}", "tool_calls": [{"name": "Read", "input": {"path": f"{step}.py"}}]}
            raw = await c.messages.with_raw_response.create(model=model, max_tokens=2000, tools=[READ],
                                                            system=SYSTEM, messages=msgs)
            r = await raw.parse()
            statuses.append(raw.headers["x-compaction-status"])
            turn = [b.model_dump(exclude_none=True) for b in r.content]
            assert turn[0]["type"] == "thinking"
            msgs.append({"role": "assistant", "content": turn})
            use = next(b for b in turn if b["type"] == "tool_use")
            msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                                      "content": filler(tool_words, step)}]})
    return msgs if history else statuses


@pytest.mark.parametrize("compaction", [{"prepare_percent": 0, "mask_tool_outputs": False},
                                        {"prepare_percent": 0}, {"mask_tool_outputs": False}],
                         ids=["summary", "masking-first", "prepared-ahead"])
async def test_a_bound_session_compacts_without_a_stale_thinking_block(fake, make_proxy, compaction):
    proxy = await make_proxy(fake.base_url, {
        "anthropic": {"base_url": fake.base_url}, "models": {MODEL: {"context_window": 6000}},
        "compaction": compaction})
    statuses = await session(proxy, fake, 16)
    bad = [(r.kind, r.status, r.body[:300]) for r in fake.requests if r.status != 200]
    assert not bad, bad
    assert "summarized" in statuses or "masked" in statuses
    # the thinking made since the last change is forwarded: the newest turns keep their reasoning,
    # and only the turns before the change lost theirs
    last = fake.messages_requests[-1]
    kept = [t for m in last["messages"] for t in thinking_in(m)]
    assert len(kept) >= 2 and kept == [f"step {k}" for k in range(15 - len(kept), 15)], kept


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_recall_round_leaves_its_later_thinking_out_of_the_clients_message(fake, make_proxy, stream):
    """The model looks something up (design.md § Recall) and answers in a second round: the client gets
    one message, which it sends back next turn. The second round's thinking was made after the
    recall round the client never sees, so on this model it would be invalid there: it is left
    out, and the next request is valid."""
    proxy = await make_proxy(fake.base_url, {
        "anthropic": {"base_url": fake.base_url}, "models": {MODEL: {"context_window": 6000}},
        "compaction": {"prepare_percent": 0, "mask_tool_outputs": False}})
    msgs = await session(proxy, fake, 12, history=True)

    asked: list[str] = []

    def reply(view: dict[str, Any]) -> Any:
        recall = next((t["function"]["name"] for t in view.get("tools") or ()
                       if t["function"]["name"].startswith("context_recall")), None)
        if recall and not asked:  # the first round looks up, the second answers
            asked.append(recall)
            return {"thinking": "look it up", "content": "Looking.",
                    "tool_calls": [{"name": recall, "arguments": {"query": "step"}}]}
        return {"thinking": "found it", "content": "Here it is."}

    fake.reply = reply
    msgs[-1]["content"].append({"type": "text", "text": "what did step 2 read?"})
    async with anthropic_client(proxy, KEY) as c:
        kw = dict(model=MODEL, max_tokens=2000, tools=[READ], system=SYSTEM, messages=msgs)
        if stream:
            async with c.messages.stream(**kw) as s:
                r = await s.get_final_message()
        else:
            r = await c.messages.create(**kw)
        content = [b.model_dump(exclude_none=True) for b in r.content]
        assert [b["type"] for b in content] == ["thinking", "text", "text"], content
        assert content[0]["thinking"] == "look it up"
        fake.reply = {"thinking": "next", "content": "ok"}
        await c.messages.create(model=MODEL, max_tokens=2000, tools=[READ], system=SYSTEM,
                                messages=[*msgs, {"role": "assistant", "content": content},
                                          {"role": "user", "content": "thanks"}])
    assert asked  # the recall tool was declared, and the model called it
    bad = [(r.kind, r.status) for r in fake.requests if r.status != 200]
    assert not bad, bad


async def test_a_model_newer_than_the_table_is_sent_again_with_drop_block(fake, make_proxy):
    """The proxy does not know this model binds its thinking, so it forwards the kept turns' blocks;
    the upstream's 400 is answered by sending once more with drop_block and its beta header, and
    the client sees only the answer."""
    fake.prefix_check = True
    newer = "claude-fable-6"
    proxy = await make_proxy(fake.base_url, {
        "anthropic": {"base_url": fake.base_url}, "models": {newer: {"context_window": 6000}},
        "compaction": {"prepare_percent": 0, "mask_tool_outputs": False}})
    statuses = await session(proxy, fake, 16, model=newer)
    assert "summarized" in statuses
    records = fake.records("messages")
    refused = [i for i, r in enumerate(records) if r.status == 400]
    assert refused
    for i in refused:  # each refusal is followed by the same request asking for the drop
        again = records[i + 1]
        assert again.status == 200 and BETA in again.headers["anthropic-beta"]
        assert again.json["thinking"] == {"type": "adaptive", "block_binding": {"prefix_mismatch_behavior": "drop_block"}}
        assert again.json["messages"] == records[i].json["messages"]
    assert await metric(proxy.root, "compaction_proxy_stale_reasoning_retries_total",
                        protocol="messages") == len(refused)


async def test_a_restart_that_lost_the_summary_still_mends_the_thinking_made_under_it(fake, make_proxy):
    """The session compacted, the kept turns' thinking was made under the summary; the proxy
    restarts (its memory store gone) and cannot summarize again: it forwards the client's history
    (failed-open), whose newest thinking is stale on that prefix. Sent once more with drop_block,
    the conversation goes on instead of ending in a 400."""
    settings = {"anthropic": {"base_url": fake.base_url}, "models": {MODEL: {"context_window": 6000}},
                "compaction": {"prepare_percent": 0, "mask_tool_outputs": False}}
    first = await make_proxy(fake.base_url, settings)
    msgs = await session(first, fake, 12, history=True)
    await first.close()
    fake.fault_target, fake.fail_status = "summarizer", 500
    again = await make_proxy(fake.base_url, settings)
    fake.reply = {"thinking": "go on", "content": "done"}
    async with anthropic_client(again, KEY) as c:
        raw = await c.with_options(max_retries=0).messages.with_raw_response.create(
            model=MODEL, max_tokens=2000, tools=[READ], system=SYSTEM, messages=msgs)
    assert raw.headers["x-compaction-status"] == "failed-open"
    assert (await raw.parse()).content[-1].text == "done"
    refused, mended = fake.records("messages")[-2:]
    assert refused.status == 400 and refused.json["messages"] == msgs  # failed-open: the history as sent
    assert mended.status == 200 and BETA in mended.headers["anthropic-beta"] and mended.json["messages"] == msgs
    assert mended.json["thinking"]["block_binding"] == {"prefix_mismatch_behavior": "drop_block"}
    assert await metric(again.root, "compaction_proxy_stale_reasoning_retries_total", protocol="messages") == 1


async def test_a_clients_own_stale_thinking_is_its_400(fake, make_proxy):
    """The proxy changed nothing: the upstream's refusal goes to the client as it came, once."""
    proxy = await make_proxy(fake.base_url, {"anthropic": {"base_url": fake.base_url}})
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "q"}]
    fake.reply = {"thinking": "t", "content": "a"}
    async with anthropic_client(proxy, KEY) as c:
        r = await c.messages.create(model=MODEL, max_tokens=500, system="one", messages=msgs)
        msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
                 {"role": "user", "content": "q2"}]
        with pytest.raises(anthropic.BadRequestError, match="bound to a different conversation"):
            await c.with_options(max_retries=0).messages.create(model=MODEL, max_tokens=500, system="two",
                                                                messages=msgs)
    assert [r.status for r in fake.records("messages")] == [200, 400]


@pytest.mark.parametrize("model, bound", [
    ("claude-fable-5-1", True), ("claude-fable-5-2-20261104", True), ("claude-opus-5-5", True),
    ("claude-sonnet-5-5", True), ("anthropic/claude-haiku-5-5", True), ("Claude-Sonnet-5-5", True),
    ("claude-mythos-5-1", False), ("claude-opus-5", False), ("claude-sonnet-4-6", False),
    ("claude-fable-5", False), ("gpt-5", False)])
def test_the_models_whose_thinking_is_bound_to_its_prefix(model, bound):
    assert binding.binds(model) is bound


def test_an_assistant_message_without_its_thinking():
    think = {"type": "thinking", "thinking": "t", "signature": "s"}
    use = {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}}
    msg = {"role": "assistant", "content": [think, {"type": "redacted_thinking", "data": "d"}, use]}
    assert binding.without_thinking(msg) == {"role": "assistant", "content": [use]}
    assert msg["content"][0] is think  # the client's message is left as it was
    only = binding.without_thinking({"role": "assistant", "content": [think]})
    assert only == {"role": "assistant", "content": [{"type": "text", "text": binding.LEFT_OUT}]}
    assert binding.without_thinking({"role": "assistant", "content": "plain"}) is None
    assert binding.without_thinking({"role": "user", "content": [use]}) is None


def test_a_record_keeps_when_it_went_live_and_an_older_one_reads_as_unknown():
    rec = SummaryRecord(covered=4, chain="ab", summary="s", live_from=9)
    assert SummaryRecord.from_bytes(rec.to_bytes()) == rec
    old = orjson.loads(rec.to_bytes())
    del old["live_from"]
    assert SummaryRecord.from_bytes(orjson.dumps(old)).live_from is None
