"""Two proxy processes sharing one real Redis (issue 5): same bytes, one summary, lock takeover.

The replicas are the real console script (`python -m proxy`) as subprocesses; the fake upstream
runs in a thread so that it serves them between tests. Both replicas start once for the module
(a start costs seconds); every test uses its own conversations, so the records one test leaves in
Redis cannot serve another.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from support.conversations import (
    MODEL,
    WINDOW,
    request_points,
    send,
    synthetic,
    tau_conversations,
)
from proxy.fake_upstream import FakeUpstream
from support.redis_server import RedisServer, redis_server_fixture
from support.replicas import Replica, running_replicas

pytestmark = pytest.mark.redis

LOCK_TTL_S = 2.0  # short, so that a summary outlasts it and the holder's beats must keep the lock
SETTINGS = {
    "models": {MODEL: {"context_window": WINDOW}},
    # count summarizer calls of compaction events only; each process learns its token ratio at its
    # own pace, so byte-for-byte comparisons between processes run without learning
    "compaction": {"prepare_percent": 0, "learn_token_ratio": False},
    "store": {"lock_ttl_s": LOCK_TTL_S, "lock_heartbeat_s": LOCK_TTL_S / 2},  # two beats to an expiry
}

scaleout_redis = redis_server_fixture("scaleout_redis", scope="module")


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeUpstream]:
    with FakeUpstream(window=WINDOW) as f:
        yield f


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory, fake: FakeUpstream, scaleout_redis: RedisServer) -> Iterator[list[Replica]]:
    with running_replicas(tmp_path_factory.mktemp("replicas"), fake.base_url, scaleout_redis.url, SETTINGS) as pair:
        yield pair


@pytest.fixture
def upstream_fake(fake: FakeUpstream) -> FakeUpstream:
    """The module's fake, with this test's recordings only and no summarizer delay."""
    fake.clear_requests()
    fake.summarizer_delay_s = 0.0
    return fake


async def _replay(clients: list[openai.AsyncOpenAI], fake: FakeUpstream, points: list) -> tuple[list[str], list[bytes], list[bytes]]:
    """Statuses, forwarded bodies and summarizer bodies of a replay, client i % n taking request i."""
    fake.clear_requests()
    statuses = [(await send(clients[i % len(clients)], history)).status for i, history in enumerate(points)]
    return statuses, [r.body for r in fake.records("chat")], [r.body for r in fake.records("summarizer")]


async def test_alternating_replicas_forward_what_one_replica_forwards(
    upstream_fake: FakeUpstream, replicas: list[Replica], make_proxy, fixtures_dir: Path, client_for
) -> None:
    points = request_points(tau_conversations(fixtures_dir, 1)[0])
    alone = await make_proxy(upstream_fake.base_url, SETTINGS)  # one replica on its own store
    statuses, forwarded, summaries = await _replay([client_for(alone)], upstream_fake, points)
    # several compaction events (masking old tool outputs now serves some requests summaries served)
    events = statuses.count("summarized")
    assert events >= 2, statuses

    statuses2, forwarded2, summaries2 = await _replay([client_for(r) for r in replicas], upstream_fake, points)
    assert statuses2 == statuses
    assert forwarded2 == forwarded  # byte for byte
    # Exactly the summarizer calls one replica makes: one summarization per compaction event.
    assert summaries2 == summaries
    assert len(set(summaries2)) == len(summaries2)
    print(f"two replicas: {len(summaries2)} summarizer calls for {events} compaction events")


@pytest.mark.parametrize("spread", ["one process", "two processes"])
async def test_ten_concurrent_requests_make_one_summary(
    upstream_fake: FakeUpstream, replicas: list[Replica], spread: str, client_for
) -> None:
    messages = synthetic(spread)
    if spread == "one process":
        upstream_fake.summarizer_delay_s = 0.5  # long enough for all ten to arrive meanwhile
        targets = [replicas[0]] * 10
    else:
        # Twice the lock's expiry and more: only the holder's beats keep its lock, whatever the
        # waiters do meanwhile.
        upstream_fake.summarizer_delay_s = 2 * LOCK_TTL_S + 0.5
        targets = [replicas[i % 2] for i in range(10)]
    turns = await asyncio.gather(*(send(client_for(r), messages) for r in targets))
    assert len(upstream_fake.summarizer_requests) == 1
    forwarded = [r.body for r in upstream_fake.records("chat")]
    assert len(forwarded) == 10 and len(set(forwarded)) == 1
    assert b"<summary>" in forwarded[0]
    assert {t.status for t in turns} <= {"summarized", "reused"}


async def test_a_replica_killed_holding_the_lock_is_taken_over(
    upstream_fake: FakeUpstream, replicas: list[Replica], scaleout_redis: RedisServer, tmp_path: Path, client_for
) -> None:
    victim = Replica(tmp_path, "victim", upstream_fake.base_url, scaleout_redis.url, SETTINGS)
    victim.start()
    try:
        await asyncio.to_thread(victim.wait_ready)
        messages = synthetic("killed mid-summary")
        upstream_fake.summarizer_delay_s = 60.0  # the victim's summary never comes back
        doomed = asyncio.create_task(send(client_for(victim), messages))
        await upstream_fake.wait_for_requests(1, "summarizer", timeout=30)
        victim.kill()
        upstream_fake.summarizer_delay_s = 0.0
        turn = await asyncio.wait_for(send(client_for(replicas[1]), messages), 30)
    finally:
        victim.kill()
    assert turn.status == "summarized"
    assert turn.wait_ms >= 500  # it waited for the dead holder's lock to expire
    assert len(upstream_fake.summarizer_requests) == 2  # the victim's, lost, and the taker's
    assert b"<summary>" in upstream_fake.records("chat")[-1].body
    with pytest.raises(openai.APIConnectionError):
        await doomed


async def test_ten_concurrent_requests_make_one_tool_note_across_replicas(
    upstream: FakeUpstream, make_proxy, redis_server: RedisServer, client_for
) -> None:
    upstream.summarizer_delay_s = 0.5
    shared = {"models": {MODEL: {"context_window": 32000}}, "store": {"url": redis_server.url}}
    pair = [await make_proxy(upstream.base_url, shared) for _ in range(2)]
    output = "\n".join(f"row {i}: booking ZX{i:05d} confirmed for passenger {i}" for i in range(600))
    messages = [
        {"role": "system", "content": "You are a travel agent."},
        {"role": "user", "content": "List every booking."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_rows", "type": "function", "function": {"name": "list_bookings", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_rows", "content": output},
    ]
    turns = await asyncio.gather(*(send(client_for(pair[i % 2]), messages) for i in range(10)))
    assert len(upstream.tool_summarizer_requests) == 1
    assert {t.headers["x-compaction-tool-results"] for t in turns} == {"1"}
    forwarded = [r.body for r in upstream.records("chat")]
    assert len(forwarded) == 10 and len(set(forwarded)) == 1
