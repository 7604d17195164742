"""Figures for issue 5's closing note (a benchmark that prints, not a test):

1. the wait of the request that crosses the threshold, with and without prepared summaries
   (x-compaction-wait-ms, median over the crossings of several replayed tau-bench conversations,
   summarizer answering after `--summarizer-s`), and the latency of the other requests;
2. summarizer calls per compaction event, one replica against two replicas sharing Redis (the real
   console script as processes, requests alternating between them).

    python bench/scaleout.py [--conversations 5] [--summarizer-s 2] [--think-s 0]

Think time is what the agent spends between two requests: 0 means "long enough for the background
work to finish" (the proxy's queue is drained before the next request), else a fixed sleep.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the fake upstream, conversations and replicas live there

from support.client import openai_client  # noqa: E402
from support.conversations import MODEL, WINDOW, request_points, send, tau_conversations  # noqa: E402
from proxy.fakes.chat import FakeUpstream  # noqa: E402
from support.proxy_server import start_proxy  # noqa: E402
from support.redis_server import RedisServer  # noqa: E402
from support.replicas import Replica  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures"


def settings(prepare_percent: float) -> dict:
    return {"models": {MODEL: {"context_window": WINDOW}}, "compaction": {"prepare_percent": prepare_percent}}


def describe(values: list[float]) -> str:
    if not values:
        return "n=0"
    q = statistics.quantiles(values, n=10, method="inclusive") if len(values) > 1 else values * 9
    return f"n={len(values)} median={statistics.median(values):.0f} p90={q[-1]:.0f} max={max(values):.0f}"


async def crossing_waits(convs: list, prepare_percent: float, summarizer_s: float, think_s: float) -> None:
    fake = FakeUpstream(window=WINDOW, summarizer_delay_s=summarizer_s)
    await fake.start()
    proxy = await start_proxy(fake.base_url, settings(prepare_percent))
    c = openai_client(proxy, "sk-bench")
    crossing, others, events = [], [], 0
    try:
        for traj in convs:
            for history in request_points(traj):
                t0 = time.perf_counter()
                turn = await send(c, history)
                elapsed = (time.perf_counter() - t0) * 1000
                if turn.status == "summarized":
                    events += 1
                    crossing.append(turn.wait_ms)
                else:
                    others.append(elapsed)
                if think_s:
                    await asyncio.sleep(think_s)
                else:
                    await proxy.state.compaction.idle()
        calls = len(fake.summarizer_requests)
    finally:
        await c.close()
        await proxy.close()
        await fake.stop()
    at_once = sum(w < 500 for w in crossing)
    print(f"  prepare_percent={prepare_percent:>3}: crossing wait ms {describe(crossing)} ({at_once} under 500 ms); "
          f"other requests' latency ms {describe(others)}; {calls} summarizer calls for {events} compaction events")


async def replay(clients: list, fake: FakeUpstream, convs: list) -> tuple[int, int, list[bytes]]:
    fake.clear_requests()
    events = 0
    for traj in convs:
        for i, history in enumerate(request_points(traj)):
            events += (await send(clients[i % len(clients)], history)).status == "summarized"
    return events, len(fake.summarizer_requests), [r.body for r in fake.records("chat")]


async def calls_per_event(convs: list) -> None:
    with tempfile.TemporaryDirectory() as tmp, RedisServer() as redis:
        fake = FakeUpstream(window=WINDOW)
        await fake.start()
        single = await start_proxy(fake.base_url, settings(0))
        pair = [Replica(Path(tmp), n, fake.base_url, redis.url, {**settings(0), "store": {"lock_ttl_s": 30}}) for n in "ab"]
        try:
            for r in pair:
                r.start()
            for r in pair:
                await asyncio.to_thread(r.wait_ready)
            async with openai_client(single, "sk-bench") as one, openai_client(pair[0], "sk-bench") as a, \
                    openai_client(pair[1], "sk-bench") as b:
                e1, c1, fwd1 = await replay([one], fake, convs)
                e2, c2, fwd2 = await replay([a, b], fake, convs)
        finally:
            for r in pair:
                r.stop()
            await single.close()
            await fake.stop()
    print(f"  one replica:  {c1} summarizer calls / {e1} compaction events = {c1 / e1:.2f} per event")
    print(f"  two replicas: {c2} summarizer calls / {e2} compaction events = {c2 / e2:.2f} per event; "
          f"forwarded bytes identical to one replica's: {fwd1 == fwd2}")


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--conversations", type=int, default=5)
    p.add_argument("--summarizer-s", type=float, default=2.0)
    p.add_argument("--think-s", type=float, default=0.0)
    args = p.parse_args()
    convs = tau_conversations(FIXTURES, args.conversations)
    think = f"{args.think_s} s" if args.think_s else "until the background work is done"
    print(f"{len(convs)} tau-bench conversations, window {WINDOW}, summarizer {args.summarizer_s} s, think time {think}")
    print("wait at the threshold-crossing request:")
    for pct in (80, 0):
        await crossing_waits(convs, pct, args.summarizer_s, args.think_s)
    print("summarizer calls per compaction event (prepare_percent 0):")
    await calls_per_event(convs)


if __name__ == "__main__":
    asyncio.run(main())
