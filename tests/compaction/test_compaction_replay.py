"""Replaying real tau-bench conversations turn by turn through the proxy with a small window."""

from __future__ import annotations

import json

import pytest

from support.client import chat, openai_client
from support.invariants import check_forwarded

WINDOW = 5000
MODEL = "gpt-4"  # cl100k_base on both sides, so proxy and fake count alike


def request_points(traj):
    """Each request a client makes: the history so far, before every assistant message."""
    return [traj[:i] for i in range(1, len(traj)) if traj[i]["role"] == "assistant"]


def clean(messages):
    # tau-bench tool messages carry a `name`; keep them as the agent sent them
    return [dict(m) for m in messages]


async def replay(client, upstream, traj):
    statuses, forwarded = [], []
    for history in request_points(traj):
        before = len(upstream.chat_requests)
        statuses.append((await chat(client, clean(history), model=MODEL)).status)
        assert len(upstream.chat_requests) == before + 1
        forwarded.append(upstream.chat_requests[-1]["messages"])
        check_forwarded(history, forwarded[-1], compacted=statuses[-1] in ("summarized", "reused"))
    return statuses, forwarded


@pytest.fixture
def long_conversations(fixtures_dir):
    data = json.loads((fixtures_dir / "tau-bench" / "gpt-4o-airline.json").read_text())
    return sorted(data, key=lambda d: -len(json.dumps(d["traj"])))[:3]


async def test_replay_reuses_summaries_and_keeps_prefix_stable(upstream, make_proxy, long_conversations):
    upstream.window = WINDOW
    proxy = await make_proxy(upstream.base_url, {"models": {MODEL: {"context_window": WINDOW}}, "compaction": {"prepare_percent": 0}})
    client = openai_client(proxy, "sk-replay")
    report = []
    for conv in long_conversations:
        n_sum_before = len(upstream.history_summarizer_requests)
        statuses, forwarded = await replay(client, upstream, conv["traj"])
        events = statuses.count("summarized")
        assert events >= 2, statuses  # long enough to compact twice with this window
        first = statuses.index("summarized")
        assert all(s in ("summarized", "reused") for s in statuses[first:]), statuses
        # the summarizer is called only at compaction events
        calls = len(upstream.history_summarizer_requests) - n_sum_before
        assert events <= calls <= 2 * events  # + at most one split-turn call per event
        # between compactions the forwarded request only grows: the previous one is its prefix
        extended = 0
        for prev, cur, status in zip(forwarded, forwarded[1:], statuses[1:]):
            if status == "reused":
                assert cur[: len(prev)] == prev
                extended += 1
        # no forwarded request exceeds the window (the fake would have rejected it)
        assert all(r.status == 200 for r in upstream.requests if r.kind == "chat")
        report.append((len(statuses), events, calls, extended))
    # the second summary of a conversation was an update of the first
    updates = [r for r in upstream.history_summarizer_requests if "<previous-summary>" in r["messages"][1]["content"]]
    assert updates, "no summary was made as an update of a previous one"
    print("replay report (requests, compactions, summarizer calls, prefix-extending requests):", report)
