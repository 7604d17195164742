"""A careless summarizer on the Responses and Messages routes (issue 12's guarantees, issues 14 and
15): it skips headings, paraphrases the request, keeps one identifier in ten and no error line,
and now and then answers the conversation instead of summarizing it (tests/support/careless.py).
What code writes must still hold on every route: the forwarded request keeps the identifiers and
the user's latest request verbatim, summaries carry every heading, acceptance refuses what is no
summary, nothing goes over the window, and the strict fakes accept every forwarded conversation
(pairs, alternation, roles). The chat originals are tests/compaction/test_careless_tiers.py and
tests/compaction/test_acceptance.py; these go through the protocols' real clients."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from proxy.fakes.summarizer_match import is_cached_history_request
from proxy.prompts import SUMMARY_HEADINGS
from support.careless import CarelessSummarizer, summarizer_cached_share
from support.coding_session import CONTINUE, KINDS, coding_session, request_then_continue
from support.compaction_helpers import chat_history
from support.gemini_driver import GEMINI
from support.protocols import MESSAGES, RESPONSES, Driver

WINDOW = 12000
PROTOCOLS = [RESPONSES, MESSAGES, GEMINI]


@pytest.fixture(params=PROTOCOLS, ids=repr)
def driver(request) -> Driver:
    return request.param


@pytest.fixture
async def fake(driver):
    f = await driver.start_fake(window=WINDOW)
    yield f
    await f.stop()


def settings(driver: Driver, fake: Any, window: int = WINDOW, **compaction: Any) -> dict[str, Any]:
    # as the chat originals run: ratio learning and the summary call that rides the prompt cache on
    return driver.settings(fake, window, compaction={"prepare_percent": 0, "learn_token_ratio": True,
                                                     "cached_summary_call": True, **compaction})


def strings(obj: Any) -> str:
    """Every string in a JSON value, one a line: the text of a request in any protocol."""
    if isinstance(obj, str):
        return obj
    if isinstance(obj, dict):
        return "\n".join(strings(v) for v in obj.values())
    if isinstance(obj, list):
        return "\n".join(strings(v) for v in obj)
    return ""


_SUMMARY = re.compile(r"<summary>\n(.*?)\n</summary>", re.DOTALL)


def summary_of(text: str) -> str | None:
    found = _SUMMARY.search(text)
    return found.group(1) if found else None


def points(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """What the agent sends: the history before each assistant message, then the closing request."""
    pts = [messages[:i] for i in range(1, len(messages)) if messages[i]["role"] == "assistant"]
    return pts + ([messages] if messages[-1]["role"] == "user" else [])


async def test_a_careless_replay_keeps_what_code_keeps(driver, fake, make_proxy):
    await careless_replay(driver, fake, make_proxy)


async def test_a_careless_replay_of_a_claude_code_shaped_session_keeps_what_code_keeps(make_proxy):
    """As Claude Code sends it: `context_management` clearing no thinking, on every request. The
    history is still compacted, and what code keeps still holds."""
    fake = await MESSAGES.start_fake(window=WINDOW)
    try:
        await careless_replay(MESSAGES, fake, make_proxy, extra_body={"context_management": {
            "edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}})
        assert all(r.json.get("context_management") for r in MESSAGES.model_calls(fake))
    finally:
        await fake.stop()


async def careless_replay(driver: Driver, fake: Any, make_proxy: Any, extra_body: dict[str, Any] | None = None) -> None:
    """A 30-turn coding session through a careless summarizer (`extra_body`: in every request)."""
    s = coding_session(30)
    fake.summarizer = careless = CarelessSummarizer()
    proxy = await make_proxy(fake.base_url, settings(driver, fake))
    statuses, summaries, missing_latest = [], [], []
    seen, verbatim = Counter(), Counter()  # kind -> (request, identifier sent so far) pairs
    for history in points(s.messages):
        reply = await driver.send(proxy, history, key="sk-careless", tools=s.tools,
                                  extra_body=extra_body)  # a 200, or it raises
        statuses.append(reply.status)
        text = strings(driver.forwarded_body(fake))
        sent = strings(history)
        users = [m["content"] for m in history if m["role"] == "user"]
        substantive = next(u for u in reversed(users) if u != CONTINUE)
        if substantive not in text:
            missing_latest.append((len(statuses), reply.status))
        for kind, ident in s.all_planted():
            if ident in sent:
                seen[kind] += 1
                verbatim[kind] += ident in text
        summary = summary_of(text)
        if summary is not None and "## Digest of earlier messages" not in summary:
            summaries.append(summary)
    calls = driver.model_calls(fake)
    assert all(r.status == 200 for r in calls), [(r.status, r.prompt_tokens, fake.window) for r in calls if r.status != 200]  # the strict fake took every forwarded conversation
    assert max(r.prompt_tokens for r in calls) <= WINDOW  # never over the window
    assert statuses.count("summarized") + statuses.count("degraded") >= 2, Counter(statuses)
    assert careless.calls and careless.replies  # it was careless, and sometimes replied
    assert missing_latest == []  # the latest substantive request verbatim in every request
    assert summaries, "no summary was ever forwarded"
    for h in SUMMARY_HEADINGS:  # every heading, whatever the model skipped
        assert f"\n{h}\n" in f"\n{summaries[-1]}\n", h
    for c in s.constraints:  # the user's constraints, from summarized messages, verbatim
        assert c in text, c
    cached, total = summarizer_cached_share(fake)
    print(f"{driver.name}: {cached} of {total} history summarizer input tokens cached ({100 * cached / total:.1f}%)")
    if driver.name == "gemini":
        # Gemini's implicit prefix cache: each summary call that rides the conversation repeats
        # the forwarded prefix, so most of its input is read from the cache
        riding = [r for r in fake.records("summarizer") if r.summarizer_kind == "history" and
                  is_cached_history_request(fake.prompts_dir, r.json["contents"][-1]["parts"][-1].get("text", ""))]
        assert riding and all(r.cached_tokens >= 0.8 * r.prompt_tokens for r in riding), [
            (r.cached_tokens, r.prompt_tokens) for r in riding]
    # OpenAI's prefix rule: the summary calls ride the conversation's cached prefix. Anthropic's
    # breakpoints: without the client's, what the summary's breakpoint wrote, then the whole prefix
    # when a careless reply is asked again on it (the first call's own breakpoint wrote it)
    assert cached >= 0.5 * total, (cached, total)
    shares = {k: verbatim[k] / seen[k] for k in seen}
    print(f"{driver.name}: statuses {dict(Counter(statuses))}; planted identifiers verbatim:",
          {k: f"{100 * v:.1f}%" for k, v in shares.items()})
    assert set(shares) == set(KINDS) and min(shares.values()) >= 0.99, shares


async def test_the_request_behind_a_kept_ok_continue_is_verbatim(driver, fake, make_proxy):
    """The newest user message is a bare "OK, continue." that was kept while the substantive
    request before it was summarized (and paraphrased by the model): code carries it verbatim."""
    msgs, tools, request = request_then_continue()
    fake.summarizer = CarelessSummarizer(reply_every=0)
    # a kept part so short that the request before "OK, continue." is summarized; no masking, so
    # the tool work after the continuation makes a new summary rather than stubs
    proxy = await make_proxy(fake.base_url, settings(driver, fake, keep_recent_tokens=300, mask_tool_outputs=False))
    statuses, kept_continuation = [], []
    for history in points(msgs):
        reply = await driver.send(proxy, history, key="sk-continue", tools=tools)
        statuses.append(reply.status)
        text = strings(driver.forwarded_body(fake))
        users = [m["content"] for m in history if m["role"] == "user"]
        substantive = next(u for u in reversed(users) if u != CONTINUE)
        assert substantive in text, (len(statuses), reply.status)
        kept = _SUMMARY.sub("", text)
        if users[-1] == CONTINUE and CONTINUE in kept and request not in kept:
            kept_continuation.append(reply.status)
    assert "summarized" in statuses or "degraded" in statuses
    assert kept_continuation, "no forwarded request kept 'OK, continue.' with its request summarized"
    assert all(r.status == 200 and r.prompt_tokens <= WINDOW for r in driver.model_calls(fake))


async def test_a_careless_summary_is_accepted_and_forwarded_with_every_heading(driver, fake, make_proxy):
    fake.summarizer = CarelessSummarizer(reply_every=0)
    proxy = await make_proxy(fake.base_url, settings(driver, fake, 6000))
    reply = await driver.send(proxy, chat_history(14, 200), key="sk-accept")
    assert reply.status == "summarized"
    summary = summary_of(strings(driver.forwarded_body(fake)))
    assert summary is not None
    for h in SUMMARY_HEADINGS:
        assert f"\n{h}\n" in f"\n{summary}\n", h
    assert "The user wants help with" in summary  # the careless model's own words are kept


def _tool_call_answer(driver: Driver) -> dict[str, Any]:
    if driver.name == "messages":
        return {"content": None, "tool_calls": [{"name": "run_tests", "input": {}}]}
    return {"content": None, "tool_calls": [{"name": "run_tests", "arguments": "{}"}]}


@pytest.mark.parametrize("answer", ["reply", "tool_call"])
async def test_an_answer_that_is_no_summary_is_refused(driver, fake, make_proxy, answer):
    """A reply to the conversation, or a tool call, is not accepted as a summary: the request,
    which fits the window, is forwarded as the client sent it (failed-open)."""
    fake.summarizer = ("Sure! I'll keep going. What should I do next?" if answer == "reply"
                       else _tool_call_answer(driver))
    proxy = await make_proxy(fake.base_url, settings(driver, fake, 6000, mask_tool_outputs=False))
    convo = chat_history(9, 200)  # over the threshold of a 6000-token window, within the window
    reply = await driver.send(proxy, convo, key="sk-accept")
    assert reply.status == "failed-open"
    assert fake.records("summarizer")  # the summary was asked for, and refused
    forwarded = {k: v for k, v in driver.forwarded_body(fake).items() if k != "stream"}  # the client's own
    assert forwarded == driver.body(convo)


@pytest.mark.parametrize("driver", [RESPONSES, MESSAGES, replace(RESPONSES, model="gpt-4"), GEMINI], ids=[
    "responses", "messages", "responses-other-tokenizer", "gemini"])
async def test_summarizer_down_for_a_whole_session(driver, fake, make_proxy):
    """Every request still succeeds: once the history passes the window, the digest written by
    code takes the summary's place (`degraded`), and each forwarded request fits, also when the
    upstream counts with another tokenizer than the proxy's (gpt-4: cl100k here, o200k there)."""
    s = coding_session(24)
    fake.fault_target = "summarizer"
    fake.fail_status = 500
    proxy = await make_proxy(fake.base_url, settings(driver, fake))
    statuses = [(await driver.send(proxy, h, key="sk-down", tools=s.tools)).status for h in points(s.messages)]
    calls = driver.model_calls(fake)
    assert all(r.status == 200 and r.prompt_tokens <= WINDOW for r in calls), [
        (i, r.status, r.prompt_tokens, statuses[i]) for i, r in enumerate(calls) if r.status != 200 or r.prompt_tokens > WINDOW]
    assert "degraded" in statuses
    first = statuses.index("degraded")
    assert all(st in ("degraded", "masked") for st in statuses[first:]), statuses[first:]


async def test_a_messages_client_that_caches_its_conversation_gets_the_summary_calls_cached(make_proxy):
    """Anthropic's breakpoint rule: a cache is read only up to a breakpoint an earlier request
    wrote. A client that marks its newest block (the top-level `cache_control`) has its history
    written on every request, so the summary call, which repeats that history before its
    instruction, is billed mostly as cached. (Without any breakpoint of the client's, the summary's
    own prefix is, and an ask again reads what the first call wrote: the replay above.)"""
    fake = await MESSAGES.start_fake(window=WINDOW)
    try:
        await careless_replay(MESSAGES, fake, make_proxy, extra_body={"cache_control": {"type": "ephemeral"}})
        cached, total = summarizer_cached_share(fake)
        assert cached >= 0.5 * total, (cached, total)
    finally:
        await fake.stop()
