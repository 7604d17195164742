"""Long replays with a careless summarizer (issue 12): tiers, the floor, what code keeps.

Every session goes through the real proxy with the openai client to the fake upstream, whose window
equals the proxy's and which rejects anything larger (as OpenAI does).
"""

from __future__ import annotations

import json
import re
from collections import Counter

import openai
import pytest

from proxy.fakes.common import count_text_tokens
from proxy.prompts import SUMMARY_HEADINGS
from support.careless import CarelessSummarizer, summarizer_cached_share
from support.client import chat, openai_client
from support.coding_session import CONTINUE, KINDS, coding_session, request_then_continue
from support.invariants import check_forwarded, text_of
from support.transcripts import enlarge_tool_outputs, swe_agent_messages

MODEL = "gpt-4"
SWE = "swe-agent/marshmallow-1867.function_calling.traj"


def all_text(messages) -> str:
    parts = []
    for m in messages:
        parts.append(text_of(m.get("content")))
        parts += [str((c.get("function") or {}).get("arguments", "")) for c in m.get("tool_calls") or ()]
    return "\n".join(parts)


def points(messages):
    pts = [messages[:i] for i in range(1, len(messages)) if messages[i]["role"] == "assistant"]
    return pts + ([messages] if messages[-1]["role"] == "user" else [])


def sessions(fixtures_dir, name):
    if name == "tau":
        data = json.loads((fixtures_dir / "tau-bench" / "gpt-4o-airline.json").read_text())
        data.sort(key=lambda d: -len(json.dumps(d["traj"])))
        return 6000, [[dict(m) for m in d["traj"]] for d in data[:3]], None
    if name == "swe":
        msgs = enlarge_tool_outputs(swe_agent_messages(fixtures_dir / SWE), lambda k: 1500, count_text_tokens).messages
        return 12000, [msgs], None
    s = coding_session(30)
    return 12000, [s.messages], s.tools


async def replay(proxy, upstream, convs, tools, check=None):
    extra = {"tools": tools} if tools else {}
    statuses = []
    async with openai_client(proxy, "sk-careless") as client:
        for conv in convs:
            for history in points(conv):
                statuses.append((await chat(client, history, model=MODEL, **extra)).status)
                fwd = upstream.chat_requests[-1]["messages"]
                if check:
                    check(history, fwd, statuses[-1])
    return statuses


def settings(window, **compaction):
    return {"models": {MODEL: {"context_window": window}},
            "compaction": {"prepare_percent": 0, "learn_token_ratio": True, "cached_summary_call": True, **compaction}}


def recall_listed(proxy) -> set[str]:
    return {x for rec in proxy.state.compaction.records.known() for x in rec.recall_identifiers}


@pytest.mark.parametrize("name", ["tau", "swe", "coding"])
async def test_careless_replays_never_go_over_the_window_nor_fail(upstream, make_proxy, fixtures_dir, name):
    window, convs, tools = sessions(fixtures_dir, name)
    upstream.window = window
    upstream.summarizer = careless = CarelessSummarizer()
    proxy = await make_proxy(upstream.base_url, settings(window))
    summaries = []

    def check(history, fwd, status):
        check_forwarded(history, fwd, compacted="<summary>" in all_text(fwd))
        text = all_text(fwd)
        if "<summary>" in text and "## Digest of earlier messages" not in text:
            summaries.append(text)

    statuses = await replay(proxy, upstream, convs, tools, check)
    chats = upstream.records("chat")
    assert all(r.status == 200 for r in chats)  # never over the window, never a failed request
    assert max(r.prompt_tokens for r in chats) <= window
    assert set(statuses) - {"none"}, "the replay never needed compaction"
    if summaries:  # the model's summaries carry every heading, whatever the model skipped
        for h in SUMMARY_HEADINGS:
            assert f"\n{h}\n" in summaries[-1], h
    if name == "coding":
        assert careless.calls and careless.replies  # it was careless, and sometimes replied


async def test_masking_alone_serves_the_swe_agent_run_with_stable_bytes(upstream, make_proxy, fixtures_dir):
    window, convs, _ = sessions(fixtures_dir, "swe")
    upstream.window = window
    upstream.summarizer = CarelessSummarizer()
    proxy = await make_proxy(upstream.base_url, settings(window))
    seen: dict[int, str] = {}
    changed = []

    def check(history, fwd, status):
        for i, m in enumerate(fwd):
            if m["role"] == "tool" and text_of(m["content"]).startswith("[tool output elided: "):
                if seen.setdefault(i, m["content"]) != m["content"]:
                    changed.append(i)

    statuses = await replay(proxy, upstream, convs, None, check)
    await proxy.state.compaction.idle()
    assert "masked" in statuses and not {"summarized", "reused", "degraded", "failed-open"} & set(statuses)
    assert upstream.history_summarizer_requests == []  # no model call at all
    assert seen and not changed  # every stub identical in every later request
    stub = next(iter(seen.values()))
    assert " tokens · " in stub and "recall id " in stub


async def test_summarizer_down_for_a_whole_session(upstream, make_proxy):
    s = coding_session(24)
    upstream.window = 12000
    upstream.fault_target = "summarizer"
    upstream.fail_status = 500
    proxy = await make_proxy(upstream.base_url, settings(12000))
    statuses = await replay(proxy, upstream, [s.messages], s.tools,
                            lambda h, f, st: check_forwarded(h, f, compacted="<summary>" in all_text(f)))
    chats = upstream.records("chat")
    assert all(r.status == 200 and r.prompt_tokens <= 12000 for r in chats)
    assert "degraded" in statuses
    first = statuses.index("degraded")
    assert all(st in ("degraded", "masked") for st in statuses[first:])


async def test_planted_identifiers_are_verbatim_or_listed_for_recall(upstream, make_proxy):
    s = coding_session(30)
    upstream.window = 12000
    upstream.summarizer = CarelessSummarizer()
    proxy = await make_proxy(upstream.base_url, settings(12000))
    missing = []
    seen, verbatim = Counter(), Counter()  # kind -> (request, identifier sent so far) pairs

    def check(history, fwd, status):
        text = all_text(fwd)
        sent = all_text(history)
        recall = recall_listed(proxy)
        missing.extend((k, v) for k, v in s.all_planted() if v in sent and v not in text and v not in recall)
        for k, v in s.all_planted():
            if v in sent:
                seen[k] += 1
                verbatim[k] += v in text

    statuses = await replay(proxy, upstream, [s.messages], s.tools, check)
    assert statuses.count("summarized") + statuses.count("degraded") >= 3
    cached, total = summarizer_cached_share(upstream)
    print(f"chat: {cached} of {total} history summarizer input tokens cached ({100 * cached / total:.1f}%)")
    assert cached >= 0.5 * total, (cached, total)  # OpenAI's prefix rule: the summary calls ride the cache
    assert missing == []
    # and nearly all of them verbatim in the forwarded request, not only listed for recall: the
    # careless model keeps one in ten, the identifier block the rest
    shares = {k: verbatim[k] / seen[k] for k in seen}
    print("planted identifiers verbatim in the forwarded requests:", {k: f"{100 * v:.1f}%" for k, v in shares.items()})
    assert set(shares) == set(KINDS) and min(shares.values()) >= 0.99, shares


def _outside_summary(text: str) -> str:
    """The forwarded text without the summary wrapper's content: what was kept, not summarized."""
    return re.sub(r"<summary>.*?</summary>", "", text, flags=re.DOTALL)


async def test_latest_substantive_request_is_verbatim_in_every_forwarded_request(upstream, make_proxy):
    msgs, tools, request = request_then_continue()
    upstream.window = 12000
    upstream.summarizer = CarelessSummarizer(reply_every=0)  # it paraphrases, and always answers a summary
    # a kept part so short that the request before "OK, continue." is summarized; no masking, so
    # that the tool work after the continuation makes a new summary rather than stubs
    proxy = await make_proxy(upstream.base_url, settings(12000, keep_recent_tokens=300, mask_tool_outputs=False))
    kept_continuation = []

    def check(history, fwd, status):
        users = [text_of(m["content"]) for m in history if m["role"] == "user"]
        # known from the session, not from the proxy's own idea of a continuation
        substantive = next(u for u in reversed(users) if u != CONTINUE)
        text = all_text(fwd)
        assert substantive in text, status
        kept = _outside_summary(text)
        fwd_users = [text_of(m.get("content")) for m in fwd if m["role"] == "user"]
        # the case that matters: "OK, continue." kept, the request it continues only in the summary
        if users[-1] == CONTINUE and fwd_users and fwd_users[-1].endswith(CONTINUE) and substantive not in kept:
            kept_continuation.append(status)

    statuses = await replay(proxy, upstream, [msgs], tools, check)
    assert "summarized" in statuses or "degraded" in statuses
    assert kept_continuation, "no forwarded request kept 'OK, continue.' with its request summarized"


async def test_constraints_from_summarized_messages_are_carried_verbatim(upstream, make_proxy):
    s = coding_session(30)
    upstream.window = 12000
    upstream.summarizer = CarelessSummarizer(reply_every=0)
    proxy = await make_proxy(upstream.base_url, settings(12000))
    last = []
    await replay(proxy, upstream, [s.messages], s.tools, lambda h, f, st: last.append(all_text(f)))
    assert "<summary>" in last[-1]
    for c in s.constraints:
        assert c in last[-1], c


@pytest.mark.parametrize("mask", [True, False])
async def test_masking_can_be_turned_off(upstream, make_proxy, fixtures_dir, mask):
    window, convs, _ = sessions(fixtures_dir, "swe")
    upstream.window = window
    proxy = await make_proxy(upstream.base_url, settings(window, mask_tool_outputs=mask))
    statuses = await replay(proxy, upstream, convs, None)
    assert ("masked" in statuses) is mask
    assert (upstream.history_summarizer_requests == []) is mask


async def test_a_request_that_cannot_be_made_to_fit_is_forwarded_and_the_upstream_answers(upstream, make_proxy):
    upstream.window = 2000
    upstream.fault_target = "summarizer"
    upstream.fail_status = 500
    proxy = await make_proxy(upstream.base_url, settings(2000))
    huge = [{"role": "user", "content": "x " * 5000}]  # one message, nothing older to compact
    async with openai_client(proxy, "sk-careless") as client:
        with pytest.raises(openai.BadRequestError) as ei:
            await client.chat.completions.create(model=MODEL, messages=huge)
    assert ei.value.code == "context_length_exceeded"


async def _summarizer_uncached(make_proxy, cached: bool) -> tuple[int, int, list]:
    from proxy.fakes.chat import FakeUpstream

    s = coding_session(30)
    async with FakeUpstream(window=12000, summarizer=CarelessSummarizer(reply_every=0)) as up:
        proxy = await make_proxy(up.base_url, settings(12000, cached_summary_call=cached, mask_tool_outputs=False))
        await replay(proxy, up, [s.messages], s.tools)
        calls = up.records("summarizer")
        return sum(r.prompt_tokens - r.cached_tokens for r in calls), len(calls), [r.json for r in calls]


async def test_the_summary_call_rides_the_prompt_cache(make_proxy):
    transcript, n_transcript, _ = await _summarizer_uncached(make_proxy, cached=False)
    riding, n_riding, bodies = await _summarizer_uncached(make_proxy, cached=True)
    assert n_riding >= 3 and n_transcript >= 3
    print(f"summarizer uncached input tokens: transcript {transcript} in {n_transcript} calls, "
          f"cached prefix {riding} in {n_riding} calls")
    assert riding <= 0.2 * transcript  # at least 80% fewer uncached input tokens
    body = bodies[-1]  # the conversation's own request: its tools, no tool call allowed, our ask last
    # the tools as the conversation's request was last forwarded: the client's, then the recall tool
    assert body["tools"][:-1] == s_tools() and body["tools"][-1]["function"]["name"] == "context_recall"
    assert body["tool_choice"] == "none"
    assert body["messages"][0]["content"].startswith("You are a careful coding agent")
    assert body["messages"][-1]["content"].startswith("Pause the conversation here")


def s_tools():
    return coding_session(1).tools


async def test_file_names_and_exception_names_of_the_swe_run_are_kept_or_listed(upstream, make_proxy, fixtures_dir):
    """The SWE-agent run (a directory listing: tox.ini, setup.cfg, CHANGELOG.rst...; source that
    raises ValueError, defines FieldInstanceResolutionError) through the careless summarizer:
    every file name without a directory and every exception class name the agent was sent is in
    the forwarded request (the identifier block) or listed for recall."""
    window, convs, tools = sessions(fixtures_dir, "swe")
    upstream.window = window
    upstream.summarizer = CarelessSummarizer()
    # no masking: the history is summarized, so what code keeps of the summarized part is what counts
    proxy = await make_proxy(upstream.base_url, settings(window, mask_tool_outputs=False))
    names = re.compile(r"(?<![\w./@-])[\w][\w.+-]*\.(?:py|ini|cfg|rst|md|txt|toml|yml|yaml|in)\b(?![\w/-])"
                       r"|\b[A-Z][A-Za-z0-9]*(?:Error|Exception)\b")
    counts = Counter()

    def check(history, fwd, status):
        text, recall = all_text(fwd), "\n".join(recall_listed(proxy))  # (an error line listed names its exception)
        for name in dict.fromkeys(names.findall(all_text(history))):
            counts["seen"] += 1
            counts["kept"] += name in text
            counts["listed"] += name in text or name in recall
            if name not in text and name not in recall:
                counts["missing: " + name] += 1

    statuses = await replay(proxy, upstream, convs, tools, check)
    assert "summarized" in statuses or "degraded" in statuses
    kept, listed = counts["kept"] / counts["seen"], counts["listed"] / counts["seen"]
    print(f"swe: file and exception names kept {100 * kept:.1f}%, kept or listed {100 * listed:.1f}% "
          f"of {counts['seen']} (request, name) pairs")
    assert listed == 1.0, [k for k in counts if k.startswith("missing")]
    assert kept >= 0.99, kept
