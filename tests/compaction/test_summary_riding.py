"""The summary call that rides the conversation's own prompt cache (design.md § The summary call rides the cache) on every protocol,
and the one summarizer every protocol shares (issue 13: the adapter builds its summarizer call).

Responses: through the real proxy to the strict fake, turn by turn: each such call repeats the
request the fake was forwarded last (instructions, tools, the items before the kept part, same
bytes) plus one user item, and the fake's prefix cache bills it as cached; a call that comes back
unusable is asked again in transcript form and counted. Messages: a flow on the Messages adapter
through the proxy's own stages, the forwarded bodies sent to the strict fake as a route sends
them; the call repeats that prefix (breakpoint markers aside: the repeated prefix's end carries
one, never more than 4) and reads Anthropic's cache. Chat and Messages compactions at once with
`max_concurrent_summaries: 1`: the second summary waits for the first. The shared budget knows
Claude's 1M window; `responses.summarizer_api: chat` asks a Responses conversation's summary in
chat."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from anthropic import AsyncAnthropic

from proxy.protocols.messages import breakpoints
from proxy.protocols.messages.adapter import MessagesAdapter
from proxy.config import Config
from proxy.fakes.chat import FakeUpstream
from proxy.fakes.messages import FakeMessages
from proxy.fakes.responses import FakeResponses
from proxy.flow import run_request
from proxy.state import ProxyState
from proxy.store.memory import MemoryStore
from support.client import post
from support.compaction_helpers import chat_history, filler
from support.flows import make_flow
from support.messages_replay import unmarked

REPO = Path(__file__).resolve().parents[2]

ASK = "Pause the conversation here"  # how the cache-riding prompt (prompts/compaction-cached-summary.md) begins
AGAIN = (REPO / "prompts" / "compaction-cached-summary-again.md").read_text(encoding="utf-8").strip()  # how it ends, asked again
KEY = "sk-riding"


def riding(record: Any, last_text: str) -> bool:
    return record.kind == "summarizer" and last_text.startswith(ASK)


def next_after(requests: list[Any], record: Any, kind: str) -> Any:
    return [r for r in requests[requests.index(record) + 1:] if r.kind == kind][0]


def turn_labels(messages: Any) -> set[str]:
    """The turns ("step 3", "done 3") whose text these messages (or their JSON) carry (claude_session writes them)."""
    return set(re.findall(r"\b(?:step|done) \d+(?=: )", messages if isinstance(messages, str) else json.dumps(messages)))


def last_before(requests: list[Any], record: Any, kind: str) -> Any:
    """The last `kind` request the fake got before `record`: what the upstream has cached."""
    return [r for r in requests[: requests.index(record)] if r.kind == kind][-1]


# -- Responses ---------------------------------------------------------------------------------

R_MODEL = "gpt-5"
SHELL = {"type": "function", "name": "shell", "description": "Run a command.",
         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}


def r_settings(**compaction: Any) -> dict[str, Any]:
    return {"models": {R_MODEL: {"context_window": 6000}}, "tool_results": {"enabled": False},
            "compaction": {"prepare_percent": 0, "cached_summary_call": True, "mask_tool_outputs": False, **compaction}}


async def responses_session(proxy: Any, turns: int, **fields: Any) -> list[str]:
    """`fields` in every body (Codex sends a prompt_cache_key: its thread id)."""
    items: list[dict[str, Any]] = []
    statuses = []
    for t in range(turns):
        items.append({"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": f"step {t}: " + filler(120, t)}]})
        body = {"model": R_MODEL, "instructions": "You are a coding agent.", "tools": [SHELL], "input": items, **fields}
        answer = await post(proxy, body, {"Authorization": f"Bearer {KEY}"}, path="/responses", expect=200)
        statuses.append(answer.headers["x-compaction-status"])
        items.append({"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": f"done {t}: " + filler(120, t + 7)}]})
    return statuses


def last_item_text(record: Any) -> str:
    items = record.json.get("input") or []
    content = items[-1].get("content") if items and isinstance(items[-1], dict) else None
    return content if isinstance(content, str) else ""


@pytest.mark.parametrize("key", [None, "thread-0193"], ids=["no-cache-key", "cache-key"])
async def test_a_responses_summary_rides_the_forwarded_prefix(make_proxy, key):
    """With a prompt_cache_key the call carries it too: OpenAI routes by prefix and key (the fake's
    cache hits only under the same key)."""
    async with FakeResponses(window=6000) as fake:
        proxy = await make_proxy(fake.base_url, r_settings())
        statuses = await responses_session(proxy, 26, **({"prompt_cache_key": key} if key else {}))
        calls = [r for r in fake.requests if riding(r, last_item_text(r))]
        assert statuses.count("summarized") >= 2 and len(calls) >= 2, (statuses, [(r.kind, r.status) for r in fake.requests if r.kind != "messages"])
        for r in calls:
            prev = last_before(fake.requests, r, "responses")
            n = len(r.json["input"]) - 1
            assert n >= 2
            # the forwarded request's own prefix, item by item in the same bytes, then our ask
            assert [orjson.dumps(x) for x in r.json["input"][:n]] == [orjson.dumps(x) for x in prev.json["input"][:n]]
            assert r.json["instructions"] == prev.json["instructions"] and r.json["tools"] == prev.json["tools"]
            assert prev.json["tools"][0] == SHELL and [t["name"] for t in prev.json["tools"][1:]] in ([], ["context_recall"])
            assert r.json["tool_choice"] == "none" and r.json["store"] is False
            assert r.json.get("prompt_cache_key") == key
            assert r.headers["authorization"] == f"Bearer {KEY}"
            assert r.cached_tokens > 0.5 * r.prompt_tokens  # billed at the cached rate
        assert "<summary>" in json.dumps(calls[-1].json["input"])  # the second one repeats the first summary
        assert proxy.state.compaction.stats["cached_call_fallbacks"] == 0


async def test_an_unusable_riding_answer_is_asked_again_in_transcript_form(make_proxy):
    def careless(view: dict[str, Any]) -> Any:
        body = view.get("raw", view)
        last = (body.get("input") or [{}])[-1]
        if isinstance(last.get("content"), str) and last["content"].startswith(ASK):
            return {"tool_calls": [{"name": "shell", "arguments": '{"cmd": "ls"}'}]}  # it carried the task on
        return None  # the transcript form: a proper summary

    async with FakeResponses(window=6000, summarizer=careless) as fake:
        proxy = await make_proxy(fake.base_url, r_settings())
        statuses = await responses_session(proxy, 18)
        summaries = fake.records("summarizer")
        assert "summarized" in statuses, (statuses, [r.status for r in summaries])
        kinds = ["riding" if riding(r, last_item_text(r)) else "transcript" for r in summaries]
        # asked once more on the same prefix, firmly (it reads what the first call cached), then in transcript form
        assert kinds[:3] == ["riding", "riding", "transcript"]
        first, again = summaries[0].json["input"], summaries[1].json["input"]
        assert again[:-1] == first[:-1] and again[-1]["content"].endswith(AGAIN)
        assert summaries[1].cached_tokens >= summaries[0].cached_tokens > 0.5 * summaries[0].prompt_tokens
        assert summaries[2].json["instructions"].startswith("You are")  # the summarizer's own system prompt
        stats = proxy.state.compaction.stats
        assert stats["cached_call_fallbacks"] == stats["cached_call_retries"] == kinds.count("riding") // 2 >= 1


# -- Messages ----------------------------------------------------------------------------------

M_MODEL = "claude-sonnet-4-6"
HEADERS = {"x-api-key": "sk-ant-riding", "anthropic-version": "2023-06-01"}
EPH = {"type": "ephemeral"}
READ = {"name": "Read", "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
SYSTEM = [{"type": "text", "text": "You are a coding agent. " + filler(40, 99), "cache_control": EPH}]
MESSAGES = MessagesAdapter()


def last_block_text(record: Any) -> str:
    msgs = record.json.get("messages") or []
    content = msgs[-1].get("content") if msgs else None
    last = content[-1] if isinstance(content, list) and content else {}
    return last.get("text", "") if isinstance(last, dict) else ""


M_SETTINGS: dict[str, Any] = {
    # the whole last request and the summary's room fit the window (the call repeats it all)
    "models": {M_MODEL: {"context_window": 12000}}, "tool_results": {"enabled": False},
    "compaction": {"prepare_percent": 0, "cached_summary_call": True, "mask_tool_outputs": False,
                   "threshold_tokens": 4000}}


# what Claude Code asks on every request: clear no thinking (its cache stays)
KEEP_THINKING = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}


async def claude_session(send: Any, turns: int = 26, marks: bool = True, **fields: Any) -> list[str]:
    """A Claude Code-like session: `send(body)` -> its x-compaction-status, turn by turn, with the
    breakpoints Claude Code sets (the system prompt, the newest user message; none without `marks`);
    `fields` in every body."""
    msgs: list[dict[str, Any]] = []
    statuses = []
    mark = {"cache_control": EPH} if marks else {}
    for t in range(turns):
        msgs = [unmarked(m) for m in msgs]
        msgs.append({"role": "user", "content": [{"type": "text", "text": f"step {t}: " + filler(120, t), **mark}]})
        system = SYSTEM if marks else unmarked(SYSTEM)
        statuses.append(await send({"model": M_MODEL, "max_tokens": 1000, "system": system, "tools": [READ],
                                    "messages": msgs, **fields}))
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": f"done {t}: " + filler(120, t + 7)}]})
    return statuses


def check_messages_riding(fake: FakeMessages, statuses: list[str], credential: tuple[str, str]) -> None:
    """Each cache-riding call repeats what was forwarded last, with the client's `credential`
    (header, value) as it sent it, and reads Anthropic's cache."""
    calls = [r for r in fake.requests if riding(r, last_block_text(r))]
    assert statuses.count("summarized") >= 2 and len(calls) >= 2, statuses
    for r in calls:
        prev = last_before(fake.requests, r, "messages")
        body, was = r.json, prev.json
        n, m = len(body["messages"]) - 1, len(was["messages"])
        assert body["messages"][-1]["role"] == "user" and body["messages"][-1]["content"][-1]["text"].startswith(ASK)
        # the request forwarded last, every message as it was (markers are not content), then
        # the answer it got, then our ask: Anthropic has it cached up to that request's breakpoint
        assert n == m + 1 and unmarked(body["messages"][:m]) == unmarked(was["messages"])
        assert body["system"] == was["system"] and body["tools"] == was["tools"]
        # the server edits the call's prefix as it edited the request's (Claude Code's thinking clearing)
        assert body.get("context_management") == was.get("context_management")
        assert was["tools"][0] == READ and [t["name"] for t in was["tools"][1:]] in ([], ["context_recall"])
        assert body["tool_choice"] == {"type": "none"} and r.headers[credential[0]] == credential[1]
        assert body["messages"][n - 1]["content"][-1]["cache_control"] == EPH  # ours: read up to the prefix's end
        assert breakpoints.count(body) <= breakpoints.MAX_BREAKPOINTS
        assert r.cached_tokens > 0.5 * r.prompt_tokens  # Anthropic's cache read
    assert "<summary>" in json.dumps(calls[-1].json["messages"])  # the second one repeats the first summary


async def test_a_messages_summary_rides_anthropics_cache_within_four_breakpoints():
    """On a flow of the Messages adapter through the proxy's stages, each body sent as a route sends it."""
    async with FakeMessages() as fake:
        cfg = Config.model_validate({"anthropic": {"base_url": fake.origin}, "store": {"url": "memory://"}, **M_SETTINGS})
        state = await ProxyState.create(cfg, store=MemoryStore(ttl_s=3600, max_records=1000))
        try:
            async with aiohttp.ClientSession() as s:

                async def send(body: dict[str, Any]) -> str:
                    flow = make_flow(raw=orjson.dumps(body), adapter=MESSAGES, cfg=cfg, headers=HEADERS)
                    await run_request(state.stages, flow)
                    async with s.post(fake.origin + "/v1/messages", data=flow.body(),
                                      headers={**HEADERS, "Content-Type": "application/json"}) as r:
                        assert r.status == 200, await r.text()
                    return flow.report.status

                statuses = await claude_session(send)
        finally:
            await state.close()
        check_messages_riding(fake, statuses, ("x-api-key", HEADERS["x-api-key"]))


async def test_the_messages_route_rides_anthropics_cache(make_proxy):
    """The same through the proxy's Messages route, with the real `anthropic` client."""
    async with FakeMessages() as fake:
        proxy = await make_proxy(fake.base_url, {"anthropic": {"base_url": fake.origin}, **M_SETTINGS})
        async with AsyncAnthropic(base_url=proxy.root, api_key=HEADERS["x-api-key"], max_retries=0) as client:

            async def send(body: dict[str, Any]) -> str:
                managed = body.pop("context_management")  # (a beta field: this SDK's create has no parameter for it)
                raw = await client.messages.with_raw_response.create(
                    **body, extra_body={"context_management": managed},
                    extra_headers={"anthropic-beta": "context-management-2025-06-27"})
                return raw.headers["x-compaction-status"]

            statuses = await claude_session(send, context_management=KEEP_THINKING)
        check_messages_riding(fake, statuses, ("authorization", f"Bearer {HEADERS['x-api-key']}"))  # as this SDK sends it
        assert all(r.json["context_management"] == KEEP_THINKING for r in fake.requests if r.kind == "messages")


async def test_without_a_client_breakpoint_a_messages_summary_reads_what_its_own_call_wrote(make_proxy):
    """No breakpoint of the client's: Anthropic has cached the forwarded requests only up to the
    summary's breakpoint, so the call repeats just the part to summarize (what follows would be
    billed in full), and an answer that is no summary is asked again on that prefix: the first
    call's breakpoint wrote it, the second reads all of it."""
    def careless(view: dict[str, Any]) -> Any:
        last = view["raw"]["messages"][-1]["content"][-1].get("text", "")
        return None if last.endswith(AGAIN) else "Sure! Let me read the next file."  # a reply, then a summary

    settings = {**M_SETTINGS, "compaction": {**M_SETTINGS["compaction"], "keep_recent_tokens": 1200, "threshold_tokens": 6000}}  # a few turns kept
    async with FakeMessages(summarizer=careless) as fake:
        proxy = await make_proxy(fake.base_url, {"anthropic": {"base_url": fake.origin}, **settings})
        async with AsyncAnthropic(base_url=proxy.root, api_key=HEADERS["x-api-key"], max_retries=0) as client:

            async def send(body: dict[str, Any]) -> str:
                raw = await client.messages.with_raw_response.create(**body)
                return raw.headers["x-compaction-status"]

            statuses = await claude_session(send, 40, marks=False)
    calls = [r for r in fake.requests if riding(r, last_block_text(r))]
    assert statuses.count("summarized") >= 2 and len(calls) >= 4 and len(calls) % 2 == 0, statuses
    for first, again in zip(calls[::2], calls[1::2]):
        compacted = next_after(fake.requests, again, "messages").json["messages"]
        kept = turn_labels(re.sub(r"<summary>.*?</summary>", "", json.dumps(compacted)))  # beside the summary
        # the summarized turns only, none of those the compacted request kept
        assert turn_labels(first.json["messages"]).isdisjoint(kept) and len(kept) >= 2, kept
        n = len(first.json["messages"]) - 1
        assert unmarked(again.json["messages"][:n]) == unmarked(first.json["messages"][:n])
        assert last_block_text(again).endswith(AGAIN)
        assert again.cached_tokens > 0.8 * again.prompt_tokens > first.cached_tokens  # it read what the first wrote
    assert proxy.state.compaction.stats["cached_call_retries"] == len(calls) // 2
    assert proxy.state.compaction.stats["cached_call_fallbacks"] == 0


# -- one summarizer for every protocol ---------------------------------------------------------


async def test_one_limit_on_summaries_in_flight_across_protocols(make_proxy):
    held, release = asyncio.Event(), asyncio.Event()

    async def slow_chat_summary(body: Any) -> None:
        held.set()
        await release.wait()
        return None  # then the fake's default summary

    async with FakeUpstream(summarizer=slow_chat_summary) as chat_fake, FakeMessages() as messages_fake:
        proxy = await make_proxy(chat_fake.base_url, {
            "anthropic": {"base_url": messages_fake.origin},
            "models": {"gpt-4": {"context_window": 6000}, M_MODEL: {"context_window": 6000}},
            "compaction": {"prepare_percent": 0, "max_concurrent_summaries": 1, "mask_tool_outputs": False}})
        chat = asyncio.create_task(post(proxy, {"model": "gpt-4", "messages": chat_history(14, 150)},
                                        {"Authorization": f"Bearer {KEY}"}, expect=200, timeout=60))
        await asyncio.wait_for(held.wait(), 30)
        history = [m for m in chat_history(14, 150, system=None)]
        claude = asyncio.create_task(post(proxy.root, {"model": M_MODEL, "max_tokens": 500, "messages": history},
                                          HEADERS, path="/v1/messages", expect=200, timeout=60))
        for _ in range(20):  # the Messages summary waits for the chat one to finish
            await asyncio.sleep(0.1)
            assert not messages_fake.records("summarizer")
        assert not claude.done()
        release.set()
        answers = await asyncio.gather(chat, claude)
        assert [a.headers["x-compaction-status"] for a in answers] == ["summarized", "summarized"]
        assert messages_fake.records("summarizer")  # asked once the chat summary was done


async def test_the_shared_budget_knows_claudes_1m_window_when_the_request_opts_in(make_proxy):
    """Claude's windows come from the shared lookup (no models: entry): 200k, or 1M with the
    `context-1m-...` beta. At 10% of the window a 30k-token request is compacted, unless it opted
    into the 1M window."""
    async with FakeMessages(window=1_000_000) as fake:
        proxy = await make_proxy(fake.base_url, {"anthropic": {"base_url": fake.origin},
                                                 "compaction": {"prepare_percent": 0, "threshold_percent": 10}})
        beta = {**HEADERS, "anthropic-beta": "context-1m-2025-08-07"}
        statuses = []
        for headers, tag in ((HEADERS, 1), (beta, 2)):
            history = chat_history(60, 230, system=None)
            history[0] = {"role": "user", "content": f"conversation {tag}: " + history[0]["content"]}
            answer = await post(proxy.root, {"model": M_MODEL, "max_tokens": 500, "messages": history}, headers,
                                path="/v1/messages", expect=200, timeout=60)
            assert 20_000 < int(answer.headers["x-compaction-tokens-before"]) < 100_000
            statuses.append(answer.headers["x-compaction-status"])
        assert statuses[0] in ("summarized", "masked") and statuses[1] == "none"


async def test_a_responses_conversation_summarized_in_chat_when_the_summarizer_speaks_only_chat(make_proxy):
    """`responses.summarizer_api: chat` with a separate summarizer server that serves only chat
    completions: the Responses conversation's summary is a chat completion there (transcript form)."""
    async with FakeResponses(window=6000) as fake, FakeUpstream() as chat_only:
        proxy = await make_proxy(fake.base_url, {**r_settings(summarizer={"base_url": chat_only.base_url}),
                                                 "responses": {"summarizer_api": "chat"}})
        statuses = await responses_session(proxy, 18)
        assert "summarized" in statuses and not fake.records("summarizer")
        calls = chat_only.records("summarizer")
        assert calls and all(r.path == "/v1/chat/completions" and r.json["messages"][0]["role"] == "system"
                             for r in calls)
