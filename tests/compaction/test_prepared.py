"""Summaries prepared ahead of time (issue 5, design.md § The store): the crossing request does not wait.

The client's think time between turns (the model answering, tools running) is simulated by
waiting for the proxy's background queue to drain after each answer: that is when a real agent's
next request would arrive, and the background summary has had its time.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from support.conversations import (
    MODEL,
    THRESHOLD,
    WINDOW,
    Turn,
    request_points,
    send,
    synthetic,
    tau_conversations,
)
from proxy.compaction.budget import Budget
from proxy.fakes.chat import FakeUpstream
from support.client import chat
from support.clock import FakeClock
from support.coding_session import coding_session
from support.invariants import check_forwarded
from support.redis_server import RedisServer

SLOW_SUMMARIZER_S = 2.0


def settings(prepare_percent: float, **compaction: object) -> dict:
    return {"models": {MODEL: {"context_window": WINDOW}}, "compaction": {"prepare_percent": prepare_percent, **compaction}}


def background_tasks() -> list[asyncio.Task]:
    names = ("prepare-", "singleflight:", "lock-heartbeat:")
    return [t for t in asyncio.all_tasks() if not t.done() and t.get_name().startswith(names)]


@pytest.mark.parametrize("prepare_percent", [80, 0])
async def test_the_crossing_request_waits_only_without_preparation(
    upstream: FakeUpstream, make_proxy, fixtures_dir: Path, prepare_percent: int, client_for
) -> None:
    upstream.window = WINDOW
    upstream.summarizer_delay_s = SLOW_SUMMARIZER_S
    proxy = await make_proxy(upstream.base_url, settings(prepare_percent))
    c = client_for(proxy)
    for history in request_points(tau_conversations(fixtures_dir, 1)[0]):
        calls = len(upstream.summarizer_requests)
        turn = await send(c, history)
        if turn.status == "summarized":
            break
        assert turn.status == "none" and turn.wait_ms == 0  # queuing a preparation costs nothing
        await proxy.state.compaction.idle()
    else:
        pytest.fail("the conversation never crossed the threshold")
    check_forwarded(history, upstream.chat_requests[-1]["messages"], compacted=True)
    if prepare_percent:
        assert turn.wait_ms < 500, turn
        assert len(upstream.summarizer_requests) == calls > 0  # made before this request came
        assert proxy.state.compaction.preparer.jobs == 1
    else:
        assert turn.wait_ms >= SLOW_SUMMARIZER_S * 1000 * 0.75, turn
        assert len(upstream.summarizer_requests) > calls == 0


async def test_every_compaction_of_a_replay_is_prepared(upstream: FakeUpstream, make_proxy, fixtures_dir: Path, client_for) -> None:
    upstream.window = WINDOW
    upstream.summarizer_delay_s = 0.05
    # recall off: on this small window the recall tool's room moves cuts so that one crossing
    # (of tens) finds its prepared summary a little short; preparation is what this test is about
    proxy = await make_proxy(upstream.base_url, {**settings(80), "recall": {"enabled": False}})
    c = client_for(proxy)
    conversations = tau_conversations(fixtures_dir, 2)
    events = 0
    for traj in conversations:
        previous: tuple[list, Turn] | None = None
        for history in request_points(traj):
            calls = len(upstream.summarizer_requests)
            turn = await send(c, history)
            forwarded = upstream.chat_requests[-1]["messages"]
            check_forwarded(history, forwarded, compacted=turn.status in ("summarized", "reused"))
            assert turn.tokens_after <= THRESHOLD
            if turn.status == "summarized":
                events += 1
                assert len(upstream.summarizer_requests) == calls, "a crossing request waited for a summary"
                assert turn.wait_ms < 500
                assert turn.tokens_after <= int(0.8 * THRESHOLD)
                # A prepared summary is carried from the request that crosses the threshold on,
                # not earlier: with the previous summary this request would have been over it.
                assert previous is not None
                grown = turn.tokens_before - previous[1].tokens_before
                assert previous[1].tokens_after + grown > THRESHOLD
            elif turn.status == "reused":
                # Between compactions the forwarded prefix only grows.
                assert previous is not None and forwarded[: len(previous[0])] == previous[0]
            previous = (forwarded, turn)
            await proxy.state.compaction.idle()
    assert events >= 2 * len(conversations)
    # One preparation per compaction event, plus at most one left unused at each conversation's end.
    assert proxy.state.compaction.preparer.jobs <= events + len(conversations)


async def test_the_queue_is_bounded_never_blocks_and_stops_with_the_proxy(
    upstream: FakeUpstream, make_proxy, caplog: pytest.LogCaptureFixture, client_for
) -> None:
    upstream.window = WINDOW
    upstream.summarizer_delay_s = 60.0  # the one worker stays busy for the whole test
    proxy = await make_proxy(upstream.base_url, settings(80, prepare_workers=1, prepare_queue=1))
    c = client_for(proxy)
    caplog.set_level(logging.DEBUG, logger="proxy.compaction")
    for i in range(5):  # five conversations past 80% of the threshold, below it
        turn = await asyncio.wait_for(send(c, synthetic(f"queued {i}", turns=12)), 10)
        assert (turn.status, turn.wait_ms) == ("none", 0)
    await upstream.wait_for_requests(1, "summarizer")
    # five jobs: one with the worker, one in the queue (prepare_queue=1), three dropped and logged
    # (the queue's bound itself: test_limits.py, seen from outside)
    assert len([r for r in caplog.records if "prepare queue full" in r.getMessage()]) == 3
    assert background_tasks()
    await asyncio.wait_for(proxy.close(), 10)
    assert background_tasks() == []  # workers and their summaries cancelled at shutdown
    assert len(upstream.summarizer_requests) == 1


@pytest.mark.parametrize("quiet_s", [119, 121], ids=["recent", "idle"])
async def test_a_conversation_idle_past_prepare_idle_s_is_not_prepared(
    upstream: FakeUpstream, make_proxy, quiet_s: float, client_for
) -> None:
    """The one worker is busy with conversation A while B's job waits; by the time the worker gets
    to B, B's last request is `quiet_s` old (on the engine's clock): prepared within
    prepare_idle_s (120 s), skipped past it."""
    upstream.window = WINDOW
    release = asyncio.Event()

    async def held(body: dict) -> None:  # A's summary waits until the test lets it go
        await release.wait()

    upstream.summarizer = held
    clock = FakeClock()
    proxy = await make_proxy(upstream.base_url, settings(80, prepare_workers=1, prepare_idle_s=120), clock=clock)
    engine = proxy.state.compaction
    c = client_for(proxy)
    assert (await send(c, synthetic("busy", turns=12))).status == "none"
    await upstream.wait_for_requests(1, "summarizer")
    assert (await send(c, synthetic("quiet", turns=12))).status == "none"
    clock.advance(quiet_s)
    release.set()
    await engine.idle()
    prepared = [r for r in upstream.records("summarizer") if "quiet" in r.body.decode()]
    if quiet_s < 120:
        assert engine.preparer.jobs == 2 and len(prepared) == 1
    else:
        assert engine.preparer.jobs == 1 and prepared == []
        # the crossing request makes the summary itself, as without preparation
        assert (await send(c, synthetic("quiet", turns=14))).status == "summarized"


async def test_preparation_and_requests_share_max_concurrent_summaries(upstream: FakeUpstream, make_proxy, client_for) -> None:
    """Four workers and four conversations to prepare, one summarizer slot: never two calls at once."""
    upstream.window = WINDOW
    in_flight = peak = 0

    async def counted(body: dict) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        for _ in range(20):  # yield to the loop, so that concurrent calls would overlap here
            await asyncio.sleep(0)
        in_flight -= 1

    upstream.summarizer = counted
    proxy = await make_proxy(upstream.base_url, settings(80, prepare_workers=4, max_concurrent_summaries=1))
    c = client_for(proxy)
    await asyncio.gather(*(send(c, synthetic(f"slot {i}", turns=12)) for i in range(4)))
    await proxy.state.compaction.idle()
    assert len(upstream.records("summarizer")) == 4
    assert peak == 1


async def test_one_preparation_per_conversation_however_many_requests(upstream: FakeUpstream, make_proxy, client_for) -> None:
    upstream.window = WINDOW
    upstream.summarizer_delay_s = 0.5
    proxy = await make_proxy(upstream.base_url, settings(80, prepare_workers=4))
    c = client_for(proxy)
    longer = synthetic("one preparation", turns=13)
    shorter = longer[:-2]  # the same conversation a turn earlier
    assert THRESHOLD * 0.8 < (await send(c, shorter)).tokens_after
    await asyncio.gather(*(send(c, shorter) for _ in range(4)))
    await upstream.wait_for_requests(1, "summarizer")
    await send(c, longer)  # the next turn, while the first preparation is still running
    await proxy.state.compaction.idle()
    assert len(upstream.summarizer_requests) == 1
    assert proxy.state.compaction.preparer.jobs == 1


async def test_a_crossing_request_joins_the_preparation_still_running(upstream: FakeUpstream, make_proxy, client_for) -> None:
    """The agent came back before the summary was ready: the request waits for the rest of that
    summary, not for a second one started from scratch."""
    upstream.window = WINDOW
    upstream.summarizer_delay_s = 1.0
    proxy = await make_proxy(upstream.base_url, settings(80))
    c = client_for(proxy)
    messages = synthetic("caught up")
    assert (await send(c, messages[:-2])).status == "none"
    await upstream.wait_for_requests(1, "summarizer")
    turn = await send(c, messages)  # crosses the threshold while the preparation runs
    assert turn.status == "summarized" and turn.wait_ms > 0
    assert len(upstream.summarizer_requests) == 1
    await proxy.state.compaction.idle()
    assert (await send(c, messages)).status == "reused"
    assert upstream.records("chat")[-1].body == upstream.records("chat")[-2].body


async def test_a_failed_preparation_leaves_the_work_to_the_crossing_request(upstream: FakeUpstream, make_proxy, client_for) -> None:
    upstream.window = WINDOW
    upstream.fault_target = "summarizer"
    upstream.fault_times = 1
    upstream.fail_status = 500
    # one summarizer call for the span: the recall tool's room would make this window fold it in two
    proxy = await make_proxy(upstream.base_url, {**settings(80), "recall": {"enabled": False}})
    c = client_for(proxy)
    messages = synthetic("failed preparation")
    assert (await send(c, messages[:-2])).status == "none"
    await proxy.state.compaction.idle()
    assert [r.status for r in upstream.records("summarizer")] == [500]
    turn = await send(c, messages)
    assert turn.status == "summarized"
    assert [r.status for r in upstream.records("summarizer")] == [500, 200]


@pytest.mark.redis
async def test_a_summary_prepared_by_one_replica_serves_another(
    upstream: FakeUpstream, make_proxy, redis_server: RedisServer, client_for
) -> None:
    upstream.window = WINDOW
    shared = {**settings(80), "store": {"url": redis_server.url}}
    a = await make_proxy(upstream.base_url, shared)
    b = await make_proxy(upstream.base_url, shared)
    messages = synthetic("prepared elsewhere")
    assert (await send(client_for(a), messages[:-2])).status == "none"
    await a.state.compaction.idle()
    assert len(upstream.summarizer_requests) == 1
    turn = await send(client_for(b), messages)  # the crossing request lands on the other replica
    assert turn.status == "summarized" and turn.wait_ms < 500
    assert len(upstream.summarizer_requests) == 1
    again = await send(client_for(a), messages)
    assert again.status == "reused"
    assert upstream.records("chat")[-1].body == upstream.records("chat")[-2].body


async def test_with_masking_the_prepared_summary_waits_for_the_request_masking_no_longer_fits(
    upstream: FakeUpstream, make_proxy, client_for
) -> None:
    """Masked (tier 1) and past the prepare line, the next summary is made ahead and waits: every
    request the masking still keeps at or under the threshold goes masked (the forwarded prefix only
    grows, the upstream's cache keeps it); the summary comes with the first request the masking
    would take over the threshold, made before it came."""
    window = 12_000
    upstream.window = window
    proxy = await make_proxy(upstream.base_url, {"models": {"gpt-4": {"context_window": window}},
                                                 "compaction": {"learn_token_ratio": False}})
    c = proxy.state.cfg.compaction
    threshold = Budget.for_model(window, threshold_tokens=c.threshold_tokens, threshold_percent=c.threshold_percent,
                                 reserve_tokens=c.reserve_tokens, keep_recent_tokens=c.keep_recent_tokens).threshold
    client, s = client_for(proxy), coding_session(14)
    rows: list[tuple[str, int, int, int]] = []  # status, tokens before, after, summaries made before it
    for history in s.request_points():
        made = len(upstream.summarizer_requests)
        r = await chat(client, history, model="gpt-4", tools=s.tools)
        rows.append((r.status, int(r.headers["x-compaction-tokens-before"]),
                     int(r.headers["x-compaction-tokens-after"]), made))
        if r.status == "summarized":
            break
        await proxy.state.compaction.idle()
    statuses = [row[0] for row in rows]
    assert statuses[-1] == "summarized" and "masked" in statuses, statuses
    first_masked = statuses.index("masked")
    masked = rows[first_masked:-1]
    assert masked and all(row[0] == "masked" and row[2] <= threshold for row in masked), rows
    assert any(row[3] > rows[first_masked][3] for row in masked), rows  # a summary was made while masking served
    (_, before_prev, after_prev, _), (_, before, _, made) = masked[-1], rows[-1]
    assert after_prev + (before - before_prev) > threshold, rows  # masking would no longer fit
    assert made == len(upstream.summarizer_requests), rows  # the crossing request called no summarizer
