"""Stages rewrite every tool result of an envelope, not only an envelope that is one result
(issue 13 / 15): a Messages user message answers all the calls of the assistant turn before it,
in one message with several `tool_result` blocks. Notes, masking stubs and clamps address each
result through `adapter.with_output(envelope, item, text)`, keep ids, error flags, the other
blocks and the other messages' bytes, and give the same bytes on every request.

Flows are built in the test (no proxy); summarizer calls go to the strict Messages fake on
loopback through the real SummaryCaller (Messages calls: the flow's adapter makes them); every
rendered body is checked by the strict Messages fake's validation."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from proxy import jsonbody
from proxy.protocols.messages.adapter import MessagesAdapter
from proxy.compaction.engine import CompactionEngine
from proxy.compaction.record import SummaryRecord
from proxy.compaction.serialize import serialize_envelope
from proxy.compaction.stage import CompactionStage
from proxy.compaction.summarizer import HistorySummarizer
from proxy.compaction.view import View, apply
from proxy.config import Config
from proxy.fakes.messages import FakeMessages
from proxy.fakes.messages.validate import Context, check_request
from proxy.flow import run_request
from proxy.model import Kind, calls_by_id
from proxy.recall.handles import in_text
from proxy.recall.keep import parts_of, replacements
from proxy.ops.hooks import Hooks
from proxy.prompts import Prompts
from proxy.store.memory import MemoryStore
from proxy.toolresults.stage import ToolResultStage
from proxy.upstream import SummaryCaller
from support.compaction_helpers import counter, filler
from support.flows import make_flow

MESSAGES = MessagesAdapter()
MODEL = "claude-sonnet-4-6"
NOTE = "[Summary of fetch_logs output]"  # what the fake upstream's tool summarizer answers


def logs(tag: str, lines: int) -> str:
    return "\n".join(f"[{tag}] worker-{i % 4} INFO job {i} finished in {i * 7} ms" for i in range(lines))


def round_trip(t: int, lines: int, *, said: str | None = None, lines_b: int | None = None) -> list[dict[str, Any]]:
    """An assistant turn calling two tools, and the user message answering both (and saying more)."""
    a, b = f"toolu_{t}a", f"toolu_{t}b"
    results: list[dict[str, Any]] = [
        {"type": "tool_result", "tool_use_id": a, "content": logs(f"{t}a", lines)},
        {"type": "tool_result", "tool_use_id": b, "is_error": True,
         "content": [{"type": "text", "text": logs(f"{t}b", lines if lines_b is None else lines_b)}]}]
    if said:
        results.append({"type": "text", "text": said})
    return [{"role": "assistant", "content": [{"type": "text", "text": f"step {t}: " + filler(30, t)},
                                              {"type": "tool_use", "id": a, "name": "fetch_logs", "input": {"q": t}},
                                              {"type": "tool_use", "id": b, "name": "fetch_logs", "input": {"q": -t}}]},
            {"role": "user", "content": results}]


def body(turns: int, lines: int, lines_b: int | None = None, **extra: Any) -> bytes:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Check the workers. " + filler(40, 1)}]
    for t in range(turns):
        msgs += round_trip(t, lines, said="which one failed?" if t == turns - 1 else None, lines_b=lines_b)
    return orjson.dumps({"model": MODEL, "max_tokens": 100, "system": "You are an agent.", "messages": msgs, **extra})


def flow_of(raw: bytes, cfg: Config):
    return make_flow(raw=raw, adapter=MESSAGES, cfg=cfg, headers={"x-api-key": "sk-ant"})


def text_of(result: dict[str, Any]) -> str:
    content = result["content"]
    return content if isinstance(content, str) else "".join(b["text"] for b in content)


def strict(rendered: bytes) -> dict[str, Any]:
    out = jsonbody.loads(rendered)
    check_request(out, Context(signer=FakeMessages().signer))  # never started: its checks
    return out


@pytest.fixture
async def upstream():
    """The Messages upstream: the stages' own calls for a Messages flow go there."""
    async with FakeMessages() as fake:
        yield fake


def tool_calls(fake: FakeMessages) -> list[Any]:
    return [r for r in fake.requests if r.summarizer_kind == "tool"]


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as s:
        yield s


def config(upstream: Any, **compaction: Any) -> Config:
    return Config.model_validate({
        "anthropic": {"base_url": upstream.origin}, "store": {"url": "memory://"},
        "tool_results": {"threshold_tokens": 300}, "models": {MODEL: {"context_window": 6000}},
        "compaction": {"prepare_percent": 0, "cached_summary_call": False, **compaction}})


async def test_every_oversized_result_of_one_message_becomes_a_note(upstream, session):
    cfg = config(upstream)
    stage = ToolResultStage(cfg, MemoryStore(ttl_s=3600, max_records=1000), SummaryCaller(session, cfg),
                            Prompts(), counter())
    raw = body(1, 80)
    flow = flow_of(raw, cfg)
    await stage.request(flow)
    assert flow.report.tool_results == 2 and len(tool_calls(upstream)) == 2
    # the notes were asked as Messages calls, with the client's key
    assert {(r.path, r.headers["x-api-key"]) for r in tool_calls(upstream)} == {("/v1/messages", "sk-ant")}
    assert all(r.json["system"].startswith(Prompts().text("tool-result-summarizer")[:20]) for r in tool_calls(upstream))
    out = strict(flow.body())
    sent = orjson.loads(raw)
    first, second, said = out["messages"][2]["content"]
    assert first["tool_use_id"] == "toolu_0a" and first["content"][0]["text"].startswith(NOTE)
    assert second["tool_use_id"] == "toolu_0b" and second["is_error"] is True
    assert second["content"][0]["text"].startswith(NOTE)
    assert said == sent["messages"][2]["content"][2]  # the user's own words stay as they were
    assert out["messages"][:2] == sent["messages"][:2] and out["system"] == sent["system"]
    # the envelope is counted again: the forwarded count is the count of what goes upstream
    assert flow.forwarded.tokens[-1] == MESSAGES.count(flow.forwarded.envelopes[-1], flow.request.encoding, counter())
    assert flow.forwarded.tokens[-1] < flow.original.tokens[-1] // 4

    again = flow_of(raw, cfg)
    await stage.request(again)
    assert again.body() == flow.body() and len(tool_calls(upstream)) == 2  # the stored notes


async def test_only_the_result_over_the_threshold_is_noted(upstream, session):
    """A result's own size decides, not its message's: two results of 200 tokens (a 400-token
    message) stay; of one large and one small result only the large one becomes a note."""
    cfg = config(upstream)
    stage = ToolResultStage(cfg, MemoryStore(ttl_s=3600, max_records=1000), SummaryCaller(session, cfg),
                            Prompts(), counter())
    small = flow_of(body(1, 14), cfg)
    assert small.forwarded.tokens[-1] > 300
    await stage.request(small)
    assert not small.changed and upstream.summarizer_requests == []
    mixed = flow_of(raw := body(1, 80, lines_b=14), cfg)
    await stage.request(mixed)
    assert mixed.report.tool_results == 1 and len(tool_calls(upstream)) == 1
    first, second, _ = strict(mixed.body())["messages"][2]["content"]
    assert text_of(first).startswith(NOTE) and second == orjson.loads(raw)["messages"][2]["content"][1]


async def test_old_results_are_masked_one_stub_each_and_reused_byte_for_byte(upstream, session):
    """Tier 1 on a Messages history whose tool results come two to a message: each old result
    gets its own stub (naming its call), no summarizer call; the next request forwards the same
    prefix."""
    cfg = config(upstream, keep_recent_tokens=1500)
    cfg.tool_results.enabled = False
    store, prompts = MemoryStore(ttl_s=3600, max_records=1000), Prompts()
    summarizer = HistorySummarizer(SummaryCaller(session, cfg), prompts,
                                   lambda t: counter().count_text(t, "cl100k_base"))
    stage = CompactionStage(CompactionEngine(cfg, store, summarizer, counter(), prompts), Hooks())

    raw = body(8, 25)
    flow = flow_of(raw, cfg)
    await run_request([stage], flow)
    assert flow.report.status == "masked" and upstream.summarizer_requests == []
    assert flow.report.tokens_after < flow.report.tokens_before
    out = strict(flow.body())
    results = [b for m in out["messages"] if isinstance(m["content"], list) for b in m["content"]
               if b["type"] == "tool_result"]
    stubs = [(b["tool_use_id"], text_of(b)) for b in results if text_of(b).startswith("[tool output elided")]
    assert len(stubs) >= 4 and len(stubs) % 2 == 0  # both results of each masked message
    for call_id, stub in stubs:
        t, side = call_id[len("toolu_"):-1], call_id[-1]
        assert f'fetch_logs({{"q":{t if side == "a" else -int(t)}}})' in stub
    assert out["messages"][-1] == orjson.loads(raw)["messages"][-1]  # the newest message is the client's

    grown = orjson.loads(body(9, 25))
    again = flow_of(orjson.dumps(grown), cfg)
    await run_request([stage], again)
    assert again.report.status in ("reused", "masked") and upstream.summarizer_requests == []
    out2 = strict(again.body())
    n = 1 + 2 * len(stubs) // 2
    assert out2["messages"][:n] == out["messages"][:n]


def test_a_record_addresses_each_result_of_an_envelope_and_clamps_them_alike():
    """masks: the envelope's digest for its first item, `digest:j` for item j; clamped: one entry
    per envelope, every result in it cut to the same share."""
    cfg = Config()
    flow = flow_of(body(2, 120), cfg)
    view = View(flow, flow.forwarded, counter())
    i = 3  # system, user, assistant, then the first answering message
    d = view.digests[i].hex()
    env = flow.forwarded.envelopes[i]
    assert [j for j, _ in env.results] == [0, 1]
    masking = SummaryRecord(covered=0, chain="", summary="", tier="mask", masks={f"{d}:1": "[stub b]"})
    out = apply(view, masking, Prompts())
    blocks = [e.value for e in out.conversation.envelopes][i]["content"]
    assert blocks[1]["content"] == [{"type": "text", "text": "[stub b]"}] and blocks[1]["is_error"] is True
    assert blocks[0] == orjson.loads(flow.request.raw)["messages"][2]["content"][0]  # item 0 untouched

    last = len(flow.forwarded) - 1
    clamping = SummaryRecord(covered=0, chain="", summary="", tier="mask",
                             clamped={view.digests[last].hex(): flow.forwarded.tokens[last] // 4})
    out = apply(view, clamping, Prompts())
    blocks = out.conversation.envelopes[last].value["content"]
    texts = [blocks[0]["content"], blocks[1]["content"][0]["text"]]
    originals = [it.text for _, it in flow.forwarded.envelopes[last].results]
    assert all(len(t) < len(o) // 2 for t, o in zip(texts, originals))
    assert blocks[2] == {"type": "text", "text": "which one failed?"}
    assert out.tokens_after < flow.total()
    strict(MESSAGES.render(flow.request, out.conversation))


def test_the_summarizer_reads_each_result_of_a_message_with_its_tool():
    flow = flow_of(body(1, 10), Config())
    env = flow.forwarded.envelopes[-1]
    text = serialize_envelope(env, calls_by_id(flow.forwarded.items()))
    heads = [line.split("]:")[0] for line in text.split("\n") if line.startswith(("[Tool result", "[User"))]
    assert heads == ["[Tool result: fetch_logs", "[Tool result: fetch_logs", "[User"]
    assert "[0b] worker-1 INFO job 1" in text.split("[Tool result")[2] and text.endswith("\n[User]: which one failed?")


async def test_each_masked_result_of_a_message_names_its_own_original(upstream, session):
    """Recall (design.md § Recall): the two results of one message, masked, name two recall handles, and
    each handle keeps that result's own output (not the first result's twice)."""
    cfg = config(upstream, keep_recent_tokens=1500)
    cfg.tool_results.enabled = False
    store, prompts = MemoryStore(ttl_s=3600, max_records=1000), Prompts()
    summarizer = HistorySummarizer(SummaryCaller(session, cfg), prompts, lambda t: counter().count_text(t, "cl100k_base"))
    stage = CompactionStage(CompactionEngine(cfg, store, summarizer, counter(), prompts), Hooks())
    flow = flow_of(body(8, 25), cfg)
    await run_request([stage], flow)
    assert flow.report.status == "masked"
    kept = {o.handle: o.text for o in replacements(parts_of(flow.original), parts_of(flow.forwarded), flow.original.n_system)}
    outputs = {it.call_id: it.text for e in flow.original.envelopes for it in e.items if it.kind is Kind.TOOL_RESULT}
    stubs = [(it.call_id, in_text(it.text)[-1]) for e in flow.forwarded.envelopes for it in e.items
             if it.kind is Kind.TOOL_RESULT and it.text.startswith("[tool output elided")]
    assert len(stubs) >= 4 and len({h for _, h in stubs}) == len(stubs)
    assert all(kept[h] == outputs[call_id] for call_id, h in stubs)
