"""Compaction on the Messages API (issue 15 items 2-6): the real `anthropic` client through the
proxy to the strict fake Messages upstream, which rejects what Anthropic rejects (alternation, a
tool_use without its result, an edited thinking signature, a fifth breakpoint). The overflow retry,
a failing summarizer, reuse and isolation run for every protocol in tests/every_protocol/test_protocols_shared.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.fakes.common import FakeError
from proxy.fakes.messages import FakeMessages
from support.client import anthropic_client, post
from support.compaction_helpers import filler, main_summary

MODEL = "claude-sonnet-4-6"
KEY = "sk-ant-compact"
HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
THINK = {"type": "enabled", "budget_tokens": 1024}
READ = {"name": "Read", "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
EPH = {"type": "ephemeral"}
SYSTEM = [{"type": "text", "text": "You are a coding agent. " + filler(40, 99), "cache_control": EPH}]


def settings(fake: FakeMessages, window: int, **compaction: Any) -> dict[str, Any]:
    return {"anthropic": {"base_url": fake.base_url}, "models": {MODEL: {"context_window": window}},
            "compaction": {"prepare_percent": 0, **compaction}}


@pytest.fixture
async def fake():
    async with FakeMessages() as f:
        yield f


def history(turns: int, words: int = 120) -> list[dict[str, Any]]:
    """User/assistant text turns, the last user one carrying Claude Code's breakpoint."""
    msgs: list[dict[str, Any]] = []
    for t in range(turns):
        msgs.append({"role": "user", "content": [{"type": "text", "text": f"question {t}: " + filler(words, t)}]})
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": f"answer {t}: " + filler(words, t + 50)}]})
    msgs.append({"role": "user", "content": [{"type": "text", "text": "What next?", "cache_control": EPH}]})
    return msgs


async def create(proxy: Any, key: str = KEY, headers: dict[str, str] | None = None, **body: Any):
    async with anthropic_client(proxy, key, default_headers=headers or {}) as c:
        raw = await c.messages.with_raw_response.create(**{"model": MODEL, "max_tokens": 2000, **body})
        return raw.headers, await raw.parse()


def breakpoints_in(body: dict[str, Any]) -> int:
    n = sum("cache_control" in b for b in (body.get("system") or []) if isinstance(b, dict))
    for m in body["messages"]:
        for b in m["content"] if isinstance(m["content"], list) else []:
            n += "cache_control" in b
    return n


# ---- history compaction --------------------------------------------------------------------------

async def test_history_is_summarized_into_the_first_user_message_with_a_breakpoint(fake, make_proxy):
    fake.summarizer = main_summary("msg-1")
    proxy = await make_proxy(fake.base_url, settings(fake, 6000))
    msgs = history(14)
    headers, answer = await create(proxy, system=SYSTEM, messages=msgs)
    assert headers["x-compaction-status"] == "summarized"
    assert int(headers["x-compaction-tokens-after"]) < int(headers["x-compaction-tokens-before"])
    fwd = fake.messages_requests[-1]
    # annotation: one more system block after the client's (which keeps its bytes and breakpoint)
    assert fwd["system"][0] == SYSTEM[0] and len(fwd["system"]) == 2 and "cache_control" not in fwd["system"][1]
    first = fwd["messages"][0]
    assert first["role"] == "user" and "msg-1" in first["content"][0]["text"]
    assert first["content"][0]["cache_control"] == EPH
    assert fwd["messages"][-1] == msgs[-1] and breakpoints_in(fwd) <= 4
    # the summarizer call was a Messages call with the client's key and the request's model
    call = fake.records("summarizer")[-1]
    assert call.headers.get("authorization") == f"Bearer {KEY}" and call.json["model"] == MODEL
    made = len(fake.records("summarizer"))
    # the next request carries the same prefix, byte for byte
    msgs2 = [*msgs[:-1], {"role": "user", "content": [{"type": "text", "text": "What next?"}]},
             {"role": "assistant", "content": [{"type": "text", "text": "Now this."}]},
             {"role": "user", "content": [{"type": "text", "text": "And then?", "cache_control": EPH}]}]
    headers2, _ = await create(proxy, system=SYSTEM, messages=msgs2)
    assert headers2["x-compaction-status"] == "reused" and len(fake.records("summarizer")) == made
    fwd2 = fake.messages_requests[-1]
    assert fwd2["system"] == fwd["system"] and fwd2["messages"][0] == fwd["messages"][0]


@pytest.mark.parametrize("system", ["You are a coding agent.", None])
async def test_a_string_system_or_none_stays_a_string_with_the_annotation(fake, make_proxy, system):
    # Bridges from Messages to chat (LiteLLM) pass system blocks on as list content, which a chat
    # template like llama.cpp's rejects: what the client sent as a string is forwarded as one.
    fake.summarizer = main_summary("msg-s")
    proxy = await make_proxy(fake.base_url, settings(fake, 6000))
    body = {"messages": history(14)} if system is None else {"system": system, "messages": history(14)}
    headers, _ = await create(proxy, **body)
    assert headers["x-compaction-status"] == "summarized"
    fwd = fake.messages_requests[-1]["system"]
    assert isinstance(fwd, str) and "compacted" in fwd.lower()
    if system:
        assert fwd.startswith(system + "\n\n")


async def test_a_summary_merges_into_a_kept_user_message_so_roles_alternate(fake, make_proxy):
    """The strict fake rejects two user messages in a row: the summary goes inside the first kept one."""
    proxy = await make_proxy(fake.base_url, settings(fake, 6000))
    headers, _ = await create(proxy, system=SYSTEM, messages=history(14))
    assert headers["x-compaction-status"] == "summarized"
    roles = [m["role"] for m in fake.messages_requests[-1]["messages"]]
    assert roles[0] == "user" and all(a != b for a, b in zip(roles, roles[1:]))


async def test_the_oldest_client_breakpoints_give_way_past_four(fake, make_proxy):
    proxy = await make_proxy(fake.base_url, settings(fake, 6000))
    system = [{"type": "text", "text": "Rules A.", "cache_control": EPH},
              {"type": "text", "text": "Rules B. " + filler(30, 3), "cache_control": EPH}]
    msgs = history(14)
    msgs[-3]["content"][0]["cache_control"] = EPH  # Claude Code marks the last two user messages
    answer = await post(proxy, {"model": MODEL, "max_tokens": 100, "system": system, "messages": msgs}, HEADERS,
                        path="/messages")
    assert answer.status == 200 and answer.headers["x-compaction-status"] == "summarized"
    fwd = fake.messages_requests[-1]
    assert breakpoints_in(fwd) == 4
    assert "cache_control" not in fwd["system"][0] and fwd["system"][1]["cache_control"] == EPH
    assert fwd["messages"][0]["content"][0]["cache_control"] == EPH


async def test_signed_thinking_and_tool_pairs_survive_a_compaction(fake, make_proxy):
    """A tool-using session with thinking on: the strict fake checks every signature, every pair,
    and that the assistant turn answered last starts with its thinking."""
    fake.reply = {"thinking": "Read it.", "tool_calls": [{"name": "Read", "input": {"path": "a.py"}}]}
    proxy = await make_proxy(fake.base_url, settings(fake, 6000, mask_tool_outputs=False))
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Fix the bug in a.py. " + filler(60, 1)}]
    async with anthropic_client(proxy, KEY) as c:
        statuses = []
        for step in range(16):
            raw = await c.messages.with_raw_response.create(model=MODEL, max_tokens=2000, thinking=THINK,
                                                            tools=[READ], system=SYSTEM, messages=msgs)
            r = await raw.parse()
            statuses.append(raw.headers["x-compaction-status"])
            turn = [b.model_dump(exclude_none=True) for b in r.content]
            msgs.append({"role": "assistant", "content": turn})
            use = next(b for b in turn if b["type"] == "tool_use")
            msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                                      "content": filler(300, step)}]})
    assert "summarized" in statuses and all(r.status == 200 for r in fake.records("messages"))


# ---- tool results ----------------------------------------------------------------------------------

async def test_an_oversized_tool_result_becomes_a_note_with_its_error_flag(fake, make_proxy):
    fake.reply = "ok"
    proxy = await make_proxy(fake.base_url, settings(fake, 200000))
    big = "\n".join(f"line {i}: ERROR at /srv/app/mod{i}.py timeout id=ORD-{1000 + i}" for i in range(900))
    msgs = [{"role": "user", "content": "run it"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_01", "name": "Read",
                                               "input": {"path": "log"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "is_error": True,
                                          "content": big}, {"type": "text", "text": "what failed?"}]}]
    headers, _ = await create(proxy, tools=[READ], messages=msgs)
    assert headers["x-compaction-tool-results"] == "1" and headers["x-compaction-status"] == "none"
    block = fake.messages_requests[-1]["messages"][2]["content"][0]
    assert block["tool_use_id"] == "toolu_01" and block["is_error"] is True
    assert block["content"][0]["type"] == "text" and len(block["content"][0]["text"]) < len(big) // 4
    assert fake.records("summarizer")[-1].summarizer_kind == "tool"


async def test_every_oversized_result_of_one_user_message_becomes_a_note(fake, make_proxy):
    """Parallel tool calls are answered in one user message: each large tool_result there is a
    note of its own, its id and error flag kept; the text beside them is the client's."""
    fake.reply = "ok"
    proxy = await make_proxy(fake.base_url, settings(fake, 200000))
    big = ["\n".join(f"line {i}: {tag} at /srv/app/mod{i}.py id=ORD-{1000 + i}" for i in range(900))
           for tag in ("ERROR timeout", "WARN retry")]
    msgs = [{"role": "user", "content": "run both"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_a", "name": "Read", "input": {"path": "a.log"}},
                {"type": "tool_use", "id": "toolu_b", "name": "Read", "input": {"path": "b.log"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_a", "is_error": True, "content": big[0]},
                {"type": "tool_result", "tool_use_id": "toolu_b", "content": [{"type": "text", "text": big[1]}]},
                {"type": "text", "text": "what failed?"}]}]
    headers, _ = await create(proxy, tools=[READ], messages=msgs)
    assert headers["x-compaction-tool-results"] == "2" and headers["x-compaction-status"] == "none"
    a, b, said = fake.messages_requests[-1]["messages"][2]["content"]
    assert (a["tool_use_id"], a["is_error"], b["tool_use_id"]) == ("toolu_a", True, "toolu_b")
    assert all(len(x["content"][0]["text"]) < len(big[0]) // 4 for x in (a, b)) and said == msgs[2]["content"][2]
    assert [r.summarizer_kind for r in fake.records("summarizer")] == ["tool", "tool"]


async def test_parallel_tool_results_are_masked_each_and_thinking_survives(fake, make_proxy):
    """A tool-using session with thinking on, two calls a turn: old outputs become stubs, one per
    tool_result, inside the user messages that carry them; the strict fake checks every
    signature and pair, and the masked prefix is forwarded the same way on the next request."""
    fake.reply = {"thinking": "Read both.", "tool_calls": [{"name": "Read", "input": {"path": "a.py"}},
                                                           {"name": "Read", "input": {"path": "b.py"}}]}
    fake.summarizer = main_summary("par")
    proxy = await make_proxy(fake.base_url, settings(fake, 6000, keep_recent_tokens=1500))
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Fix the bug in a.py and b.py. " + filler(60, 1)}]
    statuses, forwarded = [], []
    async with anthropic_client(proxy, KEY) as c:
        for step in range(14):
            raw = await c.messages.with_raw_response.create(model=MODEL, max_tokens=2000, thinking=THINK,
                                                            tools=[READ], system=SYSTEM, messages=msgs)
            r = await raw.parse()
            statuses.append(raw.headers["x-compaction-status"])
            forwarded.append(fake.messages_requests[-1])
            turn = [b.model_dump(exclude_none=True) for b in r.content]
            msgs.append({"role": "assistant", "content": turn})
            msgs.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": u["id"], "content": f"{u['id']}: " + filler(150, step + k)}
                for k, u in enumerate(b for b in turn if b["type"] == "tool_use")]})
    assert all(rec.status == 200 for rec in fake.records("messages"))
    k = statuses.index("masked")
    stubbed = [b for m in forwarded[k]["messages"] if isinstance(m["content"], list) for b in m["content"]
               if b.get("type") == "tool_result" and isinstance(b["content"], list)
               and b["content"][0]["text"].startswith("[tool output elided: Read(")]
    assert len(stubbed) >= 4 and len({b["tool_use_id"] for b in stubbed}) == len(stubbed)
    assert set(statuses[k:]) == {"masked"} and len(statuses) - k > 2 and fake.records("summarizer") == []
    for prev, nxt in zip(forwarded[k:], forwarded[k + 1:]):  # the masked prefix, forwarded the same way
        n = len(prev["messages"]) - 1  # (the client moves its breakpoint off the newest message)
        assert nxt["messages"][:n] == prev["messages"][:n]


# ---- native compaction steps aside ---------------------------------------------------------------

@pytest.mark.parametrize("native", ["context_management", "compaction_block"])
async def test_native_compaction_passes_through_untouched(fake, make_proxy, native):
    fake.extra_block_types = {"compaction"}
    proxy = await make_proxy(fake.base_url, settings(fake, 6000))
    msgs = history(14)
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 100, "system": SYSTEM, "messages": msgs}
    if native == "context_management":
        body["context_management"] = {"edits": [{"type": "compact_20260112"}]}
    else:
        msgs.insert(1, {"role": "assistant", "content": [{"type": "compaction", "content": "earlier work"}]})
        msgs.insert(2, {"role": "user", "content": "go on"})
    raw = json.dumps(body).encode()
    answer = await post(proxy, raw, {**HEADERS, "Content-Type": "application/json"}, path="/messages", expect=200)
    assert answer.headers["x-compaction-status"] == "none"
    assert fake.records("messages")[-1].body == raw and fake.records("summarizer") == []


async def test_thinking_clearing_alone_leaves_the_history_to_the_proxy(fake, make_proxy):
    """Claude Code asks for context management on every request, to clear no thinking (keep
    "all": its cache stays): that covers no span the proxy summarizes, so an over-threshold
    history is compacted as it would be without it, and the field goes upstream as sent."""
    proxy = await make_proxy(fake.base_url, settings(fake, 6000))
    edits = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
    body = {"model": MODEL, "max_tokens": 100, "system": SYSTEM, "messages": history(14), "context_management": edits}
    answer = await post(proxy, json.dumps(body).encode(), {**HEADERS, "Content-Type": "application/json"},
                        path="/messages", expect=200)
    assert answer.headers["x-compaction-status"] == "summarized"
    forwarded = fake.records("messages")[-1].json
    assert forwarded["context_management"] == edits and len(forwarded["messages"]) < len(body["messages"])
    assert fake.records("summarizer")  # (a call that rides the cache carries it too: test_summary_riding.py)


# ---- count_tokens ----------------------------------------------------------------------------------

async def test_count_tokens_counts_what_would_be_forwarded_without_making_a_summary(fake, make_proxy):
    proxy = await make_proxy(fake.base_url, settings(fake, 6000))
    msgs = history(14)
    async with anthropic_client(proxy, KEY) as c:
        before = await c.messages.count_tokens(model=MODEL, system=SYSTEM, messages=msgs)
        assert fake.records("summarizer") == []  # a count makes no summary
        assert before.input_tokens == fake.count_input_tokens({"model": MODEL, "system": SYSTEM, "messages": msgs})
        await c.messages.create(model=MODEL, max_tokens=100, system=SYSTEM, messages=msgs)
        made = len(fake.records("summarizer"))
        after = await c.messages.count_tokens(model=MODEL, system=SYSTEM, messages=msgs)
    assert after.input_tokens == fake.records("messages")[-1].prompt_tokens < before.input_tokens
    assert made > 0 and len(fake.records("summarizer")) == made


def tool_session(output: str, *, error: bool = False) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "read the log"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_9", "name": "Read",
                                               "input": {"path": "app.log"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "is_error": error,
                                          "content": output}]}]


async def count_then_send(proxy: Any, fake: FakeMessages, **body: Any) -> tuple[int, int]:
    """count_tokens for a body, then the body itself: (the count answered, the upstream's count of
    what was forwarded)."""
    async with anthropic_client(proxy, KEY) as c:
        counted = await c.messages.count_tokens(model=MODEL, **body)
        await c.messages.create(model=MODEL, max_tokens=100, **body)
    return counted.input_tokens, fake.records("messages")[-1].prompt_tokens


async def test_count_tokens_counts_an_output_over_the_size_cap_as_it_is_forwarded(fake, make_proxy):
    """Over tool_results.max_payload_tokens no summarizer is asked: the output goes clamped, with a
    notice, on every request; the count (made before any request) is of that."""
    proxy = await make_proxy(fake.base_url, {**settings(fake, 200000),
                                             "tool_results": {"threshold_tokens": 300, "max_payload_tokens": 2000}})
    log = "\n".join(f"line {i}: GET /api/orders/{i} 200 in {i % 97} ms" for i in range(1500))
    counted, forwarded = await count_then_send(proxy, fake, tools=[READ], messages=tool_session(log))
    assert counted == forwarded < fake.count_input_tokens({"model": MODEL, "tools": [READ], "messages": tool_session(log)})
    assert fake.records("summarizer") == []


async def test_count_tokens_counts_a_failed_note_as_its_notice(fake, make_proxy):
    """A note that failed is not tried again before its cool-down: each request meanwhile forwards
    the output with the failure's notice, and so does the count."""
    fake.summarizer = FakeError.anthropic(529, "Overloaded", "overloaded_error")
    proxy = await make_proxy(fake.base_url, {**settings(fake, 200000), "tool_results": {"threshold_tokens": 300}})
    log = "\n".join(f"line {i}: worker-{i % 4} ERROR job {i} failed" for i in range(300))
    await create(proxy, tools=[READ], messages=tool_session(log, error=True))
    assert "unavailable" in fake.messages_requests[-1]["messages"][2]["content"][0]["content"][0]["text"]
    counted, forwarded = await count_then_send(proxy, fake, tools=[READ], messages=tool_session(log, error=True))
    assert counted == forwarded and len(fake.records("summarizer")) == 1


def reads(n: int, words: int) -> list[dict[str, Any]]:
    """A task, then `n` Read calls each answered with a file of about `words` tokens."""
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Fix the bug in a.py. " + filler(40, 1)}]
    for t in range(n):
        msgs += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{t}", "name": "Read",
                                                    "input": {"path": f"m{t}.py"}}]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{t}",
                                               "content": f"m{t}.py: " + filler(words, t)}]}]
    return msgs


async def test_count_tokens_counts_the_masking_a_request_would_make_before_any_is_stored(fake, make_proxy):
    """Over the threshold, masking old tool outputs is enough (tier 1, no summarizer): a count made
    before any request is of the masked request the next one forwards, and makes no record."""
    fake.reply = "ok"
    proxy = await make_proxy(fake.base_url, settings(fake, 6000, keep_recent_tokens=1500))
    msgs = reads(10, 350)
    async with anthropic_client(proxy, KEY) as c:
        counted = await c.messages.count_tokens(model=MODEL, system=SYSTEM, tools=[READ], messages=msgs)
        again = await c.messages.count_tokens(model=MODEL, system=SYSTEM, tools=[READ], messages=msgs)
        raw = await c.messages.with_raw_response.create(model=MODEL, max_tokens=100, system=SYSTEM, tools=[READ],
                                                        messages=msgs)
    assert raw.headers["x-compaction-status"] == "masked" and fake.records("summarizer") == []
    forwarded = fake.records("messages")[-1].prompt_tokens
    full = fake.count_input_tokens({"model": MODEL, "system": SYSTEM, "tools": [READ], "messages": msgs})
    assert counted.input_tokens == again.input_tokens == forwarded < full



async def test_count_tokens_judges_a_1m_beta_request_against_the_1m_window(make_proxy):
    """count_tokens reads the window as the request would: with the `context-1m-...` beta a history
    over the 200k window's threshold (10%) but far under the 1M one's is counted whole, not as the
    masking a 200k-window request would make."""
    async with FakeMessages(window=1_000_000) as fake:
        proxy = await make_proxy(fake.base_url, {"anthropic": {"base_url": fake.origin},
                                                 "compaction": {"prepare_percent": 0, "threshold_percent": 10,
                                                                "keep_recent_tokens": 1500}})
        msgs = reads(12, 2200)
        full = fake.count_input_tokens({"model": MODEL, "tools": [READ], "messages": msgs})
        assert 20_000 < full < 100_000
        counts = []
        for beta in ({}, {"anthropic-beta": "context-1m-2025-08-07"}):
            async with anthropic_client(proxy, KEY, default_headers=beta) as c:
                counts.append((await c.messages.count_tokens(model=MODEL, tools=[READ], messages=msgs)).input_tokens)
    assert counts[0] < full  # the 200k window: masked
    assert counts[1] == full
