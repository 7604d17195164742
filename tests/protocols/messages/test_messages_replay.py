"""The recorded Claude Code-style session (tests/fixtures/sessions/claude-code-messages.json)
replayed turn by turn through the proxy with the anthropic client, streamed, each request
followed by its count_tokens, against the strict fake Messages upstream (which checks the thinking
signatures, the tool pairs and at most 4 breakpoints, and caches at breakpoints): its large file
read becomes a note, its history is summarized once and reused byte for byte after, no request
goes over the window, the summary prefix is read from the cache from the next request on, and
count_tokens answers what was forwarded."""

from __future__ import annotations

import pytest

from proxy.fakes.messages import FakeMessages
from support.messages_replay import replay, unmarked
from support.sessions import FIXTURE_SIGNING_KEY

MODEL = "claude-sonnet-4-6"
WINDOW = 4000  # the session reaches ~17k tokens; ~3k once its 14k-token file read is a note


@pytest.fixture
async def fake():
    async with FakeMessages(signing_key=FIXTURE_SIGNING_KEY, window=WINDOW) as f:
        yield f


async def test_the_claude_code_session_is_compacted_once_and_reused(upstream, fake, make_proxy):
    proxy = await make_proxy(upstream.base_url, {"anthropic": {"base_url": fake.base_url},
                                                 "models": {MODEL: {"context_window": WINDOW}},
                                                 "compaction": {"prepare_percent": 0}})
    run = await replay(proxy, fake)
    steps = run.steps
    statuses = run.statuses
    assert statuses.count("summarized") == 1, statuses
    k = statuses.index("summarized")
    assert set(statuses[:k]) == {"none"} and set(statuses[k + 1:]) == {"reused"} and len(statuses) - k > 3
    assert all(s.tool_results == 1 for s in steps[3:])  # the file read went as a note from its request on
    order = [(r.kind, r.summarizer_kind) for r in fake.requests if r.kind != "count_tokens"]
    at = [i for i, (kind, _) in enumerate(order) if kind == "messages"][k]  # the compacting request
    assert ("summarizer", "history") in order[:at] and ("summarizer", "history") not in order[at:]
    # Reused byte for byte: the same system (with the annotation) and summary, and each forwarded
    # request the previous one plus the new turns. (Breakpoint markers aside: the client moves its
    # own, and when both of its user breakpoints are kept its oldest system one gives way to the
    # summary's; a marker is not content to the cache.)
    first = steps[k].forwarded
    for prev, s in zip(steps[k:], steps[k + 1:]):
        fwd = s.forwarded
        assert unmarked(fwd["system"]) == unmarked(first["system"]) and fwd["messages"][0] == first["messages"][0]
        n = len(prev.forwarded["messages"])
        assert unmarked(fwd["messages"][:n]) == unmarked(prev.forwarded["messages"])
    assert first["messages"][0]["content"][0]["cache_control"] == {"type": "ephemeral"}
    # never over the window; the compacted prefix read from the cache from the next request on
    assert max(s.prompt_tokens for s in steps) <= WINDOW
    for prev, s in zip(steps[k:], steps[k + 1:]):
        assert s.cache_read >= prev.prompt_tokens * 0.9, (s.cache_read, prev.prompt_tokens)
    # count_tokens is the count of what went upstream
    assert [s.counted for s in steps] == [s.prompt_tokens for s in steps]
    shares = [s.cache_read / s.prompt_tokens for s in steps[k + 1:]]
    print(f"\nMessages replay (window {WINDOW}): {len(steps)} requests, statuses {statuses}; "
          f"history summarizer calls {sum(1 for kind, sk in order if sk == 'history')}; "
          f"cache hit share after the compaction {min(shares):.0%}-{max(shares):.0%}; "
          f"largest forwarded {max(s.prompt_tokens for s in steps)} of {WINDOW} "
          f"(the session itself reaches {max(s.before for s in steps)}); count_tokens equal on all {len(steps)}")
