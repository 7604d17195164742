"""Every benchmark workload against direct, the bare forwarder, nginx (when installed) and the proxy.

    python bench/run.py [--quick] [--only WORKLOAD[,WORKLOAD...]] [--store sqlite|memory]

Starts the fast fake upstream, the bare aiohttp forwarder (the in-run baseline), nginx if it is
installed, and the proxy (the real `compaction-proxy` console script, uvloop), each as its own
process on a free loopback port. Each workload runs in rounds that alternate the targets (the order
rotates every round) so that a noisy neighbour hurts them all alike. Prints a table of median/p99
latency, added latency vs direct, throughput, CPU per request of the server process and the ratios
to the baseline, then checks the issue's targets, and writes the figures as JSON to bench/results/.

Exit status: 0 when every workload ran and the proxy answered as expected (status headers, SSE
events); 1 when the benchmark itself broke. Timing never fails a run: `--quick` is CI's smoke run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

if __package__ in (None, ""):  # `python bench/run.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import big_body_stall, procs, report, zones  # noqa: E402
from bench.fake_upstream import install_uvloop  # noqa: E402
from bench.profile import Profiler, top_functions  # noqa: E402
from bench.loadgen import LoadError, LoadResult, Request, hold_streams, percentile, run_load  # noqa: E402
from bench.stats import BASELINE, DIRECT, NGINX, NO_METRICS, NO_OPS, PROXY, Tally, summarize  # noqa: E402
from bench.workloads import (GEMINI_KEY, agent_conversation, agent_protocol_body, protocol_path, small_body,  # noqa: E402
                             small_protocol_body)

RESULTS_DIR = procs.BENCH_DIR / "results"
SMALL_MODEL, LONG_MODEL, REUSED_MODEL, CROSS_MODEL = "bench-small", "bench-long", "bench-reused", "bench-cross"
LONG_WINDOW = 1_000_000  # the growing conversation never reaches this model's threshold
CROSS_WINDOW = 60_000  # threshold 51000 tokens: crossed after about 45 turns
THINK_S = 0.05  # between the requests of the crossing conversations: the model's time to answer
HOLD_S = 120  # idle streams stay open this long unless the client goes first
BIG_MB = 40  # issue 39: a 40 MB request beside small ones


@dataclass(frozen=True)
class Sizes:
    """How much each workload does; FULL for the figures, QUICK for CI's smoke run."""

    rounds: int
    warmup: int
    small_1: int  # requests per round and target
    small_16: int
    long_convs: int  # conversations growing in lockstep
    long_steps: int  # turns per conversation (about 1000 tokens each)
    long_buckets: int  # CPU and latency reported per bucket of steps
    large_4: int
    reused_turns: int  # history turns of about 1000 tokens
    reused_window: int  # so that the history compacts once
    reused_per_round: int
    crossing_convs: int  # conversations grown until they cross the threshold
    stream_8: int
    throughput: int  # requests per round and worker count
    stream_chunks: int
    stream_delay_ms: float
    idle_streams: int
    zone_turns: int = zones.MAX_TURNS  # the zones walk's longest session
    zone_per_window: int = zones.TURNS_PER_WINDOW  # a turn of the zones walk is this share of the window
    zone_settle_s: float = zones.SETTLE_S
    big_bodies: int = 2  # requests of BIG_MB sent one after the other


FULL = Sizes(rounds=10, warmup=100, small_1=500, small_16=1500, long_convs=12, long_steps=100, long_buckets=10,
             large_4=60, reused_turns=1000, reused_window=400_000, reused_per_round=10, crossing_convs=6, stream_8=80,
             throughput=3000, stream_chunks=16, stream_delay_ms=2.0, idle_streams=1000)
QUICK = Sizes(rounds=2, warmup=20, small_1=150, small_16=300, long_convs=2, long_steps=20, long_buckets=2,
              large_4=20, reused_turns=150, reused_window=100_000, reused_per_round=4, crossing_convs=1, stream_8=24,
              throughput=400, stream_chunks=8, stream_delay_ms=2.0, idle_streams=100, zone_per_window=24,
              zone_settle_s=0.02, big_bodies=1)

PROTOCOL_WORKLOADS = tuple(f"{p}_{w}" for p in ("messages", "responses", "gemini") for w in ("small", "stream", "large"))
WORKLOADS = ("small_1", "small_16", "long_conv", "large_4", "reused", "crossing", "stream_8", "stream_8_spread", "memory",
             "throughput", *PROTOCOL_WORKLOADS, "zones", "prepare_repeat", "big_body")
SLOW = ("big_body",)  # not in --quick's default set: tens of seconds of 40 MB bodies
PROTOCOL_HEADERS = {"messages": {"anthropic-version": "2023-06-01"}, "responses": {}, "gemini": GEMINI_KEY}
THROUGHPUT_CLIENTS = 32
WORKER_COUNTS = (1, 2)


@dataclass
class Target:
    name: str
    port: int
    server: procs.Server  # whose CPU and memory are measured (the fake upstream for `direct`)
    proxy: bool = False  # a build of the proxy (this one or an --also one): zones starts one more of it
    command: list[str] | None = None  # how it was started (None: this build's console script)


class Bench:
    def __init__(self, targets: list[Target], upstream: procs.Server, sizes: Sizes, *, workdir: Path | None = None,
                 store: str = "sqlite", proxy_env: dict[str, str] | None = None) -> None:
        self.targets = targets
        self.workdir = workdir
        self.store = store
        self.proxy_env = proxy_env or {}
        self.upstream = upstream
        self.sizes = sizes
        self.problems: list[str] = []
        self.spy: Profiler | None = None  # started by the workload's first measured round

    def target(self, name: str) -> Target | None:
        return next((t for t in self.targets if t.name == name), None)

    def with_targets(self, targets: list[Any]) -> "Bench":
        """The same run's settings on other targets (servers a workload started for itself)."""
        return Bench(targets, self.upstream, self.sizes, workdir=self.workdir, store=self.store, proxy_env=self.proxy_env)

    async def measure(self, target: Target, run: Callable[[Target], Awaitable[LoadResult]], tally: Tally) -> LoadResult:
        cpu0, up0, f0 = target.server.cpu(), self.upstream.cpu(), target.server.faults()
        load = await run(target)
        tally.add(load, target.server.cpu() - cpu0, self.upstream.cpu() - up0, target.server.faults() - f0)
        return load

    async def interleaved(
        self, rounds: int, run: Callable[[Target, int], Awaitable[LoadResult]], *,
        tallies: dict[str, Tally] | None = None, offset: int = 0,
    ) -> dict[str, Tally]:
        """`rounds` rounds; each runs every target once, in an order rotated by one each round.

        Results add up into `tallies` (new ones by default); `offset` continues an earlier rotation.
        """
        tallies = tallies if tallies is not None else {t.name: Tally() for t in self.targets}
        if self.spy is not None and not self.spy.running:
            self.spy.start()
        for r in range(rounds):
            k = (r + offset) % len(self.targets)
            for t in self.targets[k:] + self.targets[:k]:
                await self.measure(t, lambda t, r=r: run(t, r), tallies[t.name])
        return tallies

    async def warm(self, req: Request, clients: int = 1) -> None:
        for t in self.targets:
            await run_load(t.port, [req], count=self.sizes.warmup, clients=clients)

    def expect_status(self, workload: str, tally: Tally | None, allowed: set[str]) -> None:
        """The proxy must have treated every request as the workload intends (else it measures nothing)."""
        if tally is None:
            return
        wrong = {s: n for s, n in tally.statuses().items() if s not in allowed}
        if wrong:
            self.problems.append(f"{workload}: proxy answered x-compaction-status {wrong}, expected {sorted(allowed)}")


# -- workloads ------------------------------------------------------------------------------------


async def small(bench: Bench, clients: int, count: int) -> dict[str, Any]:
    req = Request(small_body(SMALL_MODEL))
    await bench.warm(req, clients)
    tallies = await bench.interleaved(bench.sizes.rounds, lambda t, r: run_load(t.port, [req], count=count, clients=clients))
    bench.expect_status(f"small_{clients}", tallies.get(PROXY), {"none"})
    return {"description": f"small non-streaming request, {clients} client(s)", "metric": "latency",
            "targets": summarize(tallies)}


async def long_conv(bench: Bench) -> dict[str, Any]:
    """Conversations growing a turn per request up to ~100k tokens; figures per bucket of steps."""
    s = bench.sizes
    convs = [agent_conversation(LONG_MODEL, seed=1000 + i, turns=s.long_steps, turn_tokens=1000) for i in range(s.long_convs)]
    await bench.warm(Request(small_body(LONG_MODEL)))
    per_bucket = max(1, s.long_steps // s.long_buckets)
    overall = {t.name: Tally() for t in bench.targets}
    buckets = []
    for first in range(0, s.long_steps, per_bucket):
        steps = range(first, min(first + per_bucket, s.long_steps))
        tallies = {t.name: Tally() for t in bench.targets}
        for k in steps:  # one round per step: every conversation grows by a turn on every target
            reqs = [Request(c.body(k)) for c in convs]
            await bench.interleaved(1, lambda t, r: run_load(t.port, reqs, count=len(reqs)), tallies=tallies, offset=k)
        for name, t in tallies.items():
            overall[name].merge(t)
        proxy = tallies.get(PROXY)
        buckets.append({"steps": [steps.start, steps.stop - 1],
                        "body_kb": sum(len(r.body) for r in reqs) / len(reqs) / 1024,  # at the last step
                        "tokens": proxy.header_mean("x-compaction-tokens-before") if proxy else None,
                        "targets": summarize(tallies)})
    bench.expect_status("long_conv", overall.get(PROXY), {"none"})
    return {"description": f"{s.long_convs} conversations growing one ~1k-token turn per request to "
                           f"~{s.long_steps}k tokens, 1 client", "metric": "latency",
            "targets": summarize(overall), "buckets": buckets}


async def large_4(bench: Bench) -> dict[str, Any]:
    s = bench.sizes
    conv = agent_conversation(LONG_MODEL, seed=1000, turns=s.long_steps, turn_tokens=1000)
    req = Request(conv.body(s.long_steps - 1))
    await bench.warm(req, 4)
    tallies = await bench.interleaved(s.rounds, lambda t, r: run_load(t.port, [req], count=s.large_4, clients=4))
    bench.expect_status("large_4", tallies.get(PROXY), {"none"})
    return {"description": f"one ~{s.long_steps}k-token body ({len(req.body) // 1024} KiB) repeated, 4 clients",
            "metric": "latency", "targets": summarize(tallies)}


async def reused(bench: Bench) -> dict[str, Any]:
    """~1M tokens of history compacted once (warm-up), then requests that reuse the stored summary."""
    s = bench.sizes
    extra = s.rounds * s.reused_per_round + 1
    conv = agent_conversation(REUSED_MODEL, seed=7, turns=s.reused_turns, turn_tokens=1000, short_turns=extra)
    proxy = bench.target(PROXY)
    warm: dict[str, Any] = {}
    if proxy is not None:
        before = upstream_stats(bench.upstream)
        first = await run_load(proxy.port, [Request(conv.body(s.reused_turns))], count=1, timeout_s=300)
        after = upstream_stats(bench.upstream)
        r = first.results[0]
        warm = {"latency_ms": r.latency * 1000, "status": r.headers.get("x-compaction-status"),
                "tokens_before": r.headers.get("x-compaction-tokens-before"),
                "tokens_after": r.headers.get("x-compaction-tokens-after"),
                "summarizer_calls": after["summarizer"] - before["summarizer"]}
        if warm["status"] != "summarized":
            bench.problems.append(f"reused: the warm-up request was {warm['status']!r}, expected 'summarized'")

    def run(t: Target, r: int) -> Awaitable[LoadResult]:
        base = s.reused_turns + 1 + r * s.reused_per_round
        reqs = [Request(conv.body(base + j)) for j in range(s.reused_per_round)]
        return run_load(t.port, reqs, count=len(reqs), timeout_s=120)

    tallies = await bench.interleaved(s.rounds, run)
    bench.expect_status("reused", tallies.get(PROXY), {"reused"})
    return {"description": f"~{s.reused_turns}k tokens of history with a stored summary (`reused`), 1 client",
            "metric": "latency", "targets": summarize(tallies), "warmup": warm,
            "body_kb": len(conv.body(s.reused_turns)) // 1024}


async def crossing(bench: Bench) -> dict[str, Any]:
    """Conversations grown a turn at a time (THINK_S apart) until the proxy compacts: the request that
    crosses the threshold should find a summary prepared in the background and not wait for one."""
    proxy, direct = bench.target(PROXY), bench.target(DIRECT)
    if proxy is None or direct is None:
        return {"description": "crossing the threshold (needs the proxy)", "metric": "crossing", "targets": {}}
    events = []
    for i in range(bench.sizes.crossing_convs):
        conv = agent_conversation(CROSS_MODEL, seed=5000 + i, turns=80, turn_tokens=1000)
        for k in range(len(conv)):
            req = Request(conv.body(k))
            r = (await run_load(proxy.port, [req], count=1)).results[0]
            if r.headers.get("x-compaction-status", "none") != "none":
                same = await run_load(direct.port, [req], count=5)
                events.append({"turn": k, "status": r.headers.get("x-compaction-status"),
                               "latency_ms": r.latency * 1000, "direct_ms": percentile(same.latencies, 50) * 1000,
                               "wait_ms": float(r.headers.get("x-compaction-wait-ms", "nan")),
                               "tokens_before": r.headers.get("x-compaction-tokens-before"),
                               "tokens_after": r.headers.get("x-compaction-tokens-after")})
                break
            await asyncio.sleep(THINK_S)
        else:
            bench.problems.append(f"crossing: conversation {i} never compacted")
    if any(e["status"] != "summarized" for e in events):
        bench.problems.append(f"crossing: statuses {[e['status'] for e in events]}, expected 'summarized'")
    row: dict[str, Any] = {"n": len(events), "events": events}
    if events:
        row["max_wait_ms"] = max(e["wait_ms"] for e in events)
        row["p50_added_ms"] = percentile([e["latency_ms"] - e["direct_ms"] for e in events], 50)
    return {"description": f"conversations grown until they cross a {CROSS_WINDOW}-token window's threshold, "
                           f"{THINK_S * 1000:g} ms between requests (proxy only)",
            "metric": "crossing", "targets": {PROXY: row}}


async def stream_8(bench: Bench, *, spread: bool = False) -> dict[str, Any]:
    """8 clients streaming. In step (the default) they start together and every stream takes as
    long, so each client's next request comes at the same moment as the others': every request
    arrives in a burst of 8, and each first event waits for all eight request sides. `spread`: each
    client waits up to a stream's length after each answer, so they drift out of step, as agents
    that think and run tools between their requests do."""
    s = bench.sizes
    req = Request(small_body(SMALL_MODEL, stream=True),
                  {"x-bench-chunks": str(s.stream_chunks), "x-bench-chunk-delay-ms": str(s.stream_delay_ms)})
    think_s = s.stream_chunks * s.stream_delay_ms / 1000 if spread else 0.0
    name = "stream_8_spread" if spread else "stream_8"
    await bench.warm(req, 8)
    tallies = await bench.interleaved(s.rounds, lambda t, r: run_load(t.port, [req], count=s.stream_8, clients=8,
                                                                      think_s=think_s))
    rows = summarize(tallies, metric="ttfb")
    for tname, t in tallies.items():
        short = [r for r in t.results if r.events != int(r.headers.get("x-bench-events", -1))]
        rows[tname]["events_per_stream"] = s.stream_chunks
        rows[tname]["streams_missing_events"] = len(short)
        # Events that arrived in the same socket read as another: the delay between them was lost.
        rows[tname]["coalesced_events_pct"] = 100 * sum(max(0, r.events - r.reads) for r in t.results) / max(1, t.n * s.stream_chunks)
        if short:
            bench.problems.append(f"{name}: {len(short)} {tname} streams lost events")
    bench.expect_status(name, tallies.get(PROXY), {"none"})
    step = (f"out of step: each waits 0-{think_s * 1000:g} ms after a stream" if spread
            else "in step: each sends its next request when its stream ends")
    return {"description": f"streaming, {s.stream_chunks} events {s.stream_delay_ms:g} ms apart, 8 clients {step} "
                           "(figures: time to first event)", "metric": "ttfb", "targets": rows}


async def memory(bench: Bench) -> dict[str, Any]:
    """N concurrent idle streams (the upstream holds them open): the server's RSS under them."""
    s = bench.sizes
    req = Request(small_body(SMALL_MODEL, stream=True), {"x-bench-hold-s": str(HOLD_S)})
    rows: dict[str, Any] = {}
    for t in bench.targets:
        if t.name == DIRECT:
            continue
        rss0 = t.server.rss()
        held = await hold_streams(t.port, s.idle_streams, req, timeout_s=120)
        rss1 = t.server.rss()
        await held.close()
        released = await wait_streams_closed(bench.upstream)
        rows[t.name] = {"streams": s.idle_streams, "rss_before_mb": rss0, "rss_under_load_mb": rss1,
                        "rss_peak_mb": t.server.rss("VmHWM"), "kb_per_stream": (rss1 - rss0) * 1024 / s.idle_streams,
                        "open_s": held.open_s, "upstream_released": released}
    return {"description": f"{s.idle_streams} concurrent idle streams", "metric": "memory", "targets": rows}


async def throughput(bench: Bench) -> dict[str, Any]:
    """Requests per second of small requests from many clients, the proxy with 1 and with 2 workers
    (`server.workers`), side by side. The load generator (this process) and the fake upstream are
    pinned to CPU 0, their share; the proxy's processes may run anywhere."""
    s = bench.sizes
    assert bench.workdir is not None
    req = Request(small_body(SMALL_MODEL))
    targets: list[Target] = []
    pinned = {0} if len(os.sched_getaffinity(0)) > 1 else os.sched_getaffinity(0)
    mine, upstream_cpus = os.sched_getaffinity(0), os.sched_getaffinity(bench.upstream.popen.pid)
    try:
        for n in WORKER_COUNTS:
            server = procs.start_proxy(bench.workdir, bench.upstream.port, models={SMALL_MODEL: 128_000}, store=bench.store,
                                       extra_env={**bench.proxy_env, "COMPACTION_PROXY_SERVER__WORKERS": str(n)},
                                       name=f"proxy-{n}w")
            targets.append(Target(f"{n} worker" + "s" * (n > 1), server.port, server))
        os.sched_setaffinity(0, pinned)
        os.sched_setaffinity(bench.upstream.popen.pid, pinned)
        for t in targets:
            await run_load(t.port, [req], count=s.warmup * 4, clients=THROUGHPUT_CLIENTS)
        tallies = {t.name: Tally() for t in targets}
        for r in range(s.rounds):
            for t in targets[r % 2:] + targets[:r % 2]:
                await bench.measure(t, lambda t: run_load(t.port, [req], count=s.throughput, clients=THROUGHPUT_CLIENTS),
                                    tallies[t.name])
    finally:
        os.sched_setaffinity(0, mine)
        with contextlib.suppress(OSError):
            os.sched_setaffinity(bench.upstream.popen.pid, upstream_cpus)
        for t in targets:
            t.server.stop()
    rows = summarize(tallies)
    one, two = (rows.get(t.name, {}).get("throughput_rps") for t in targets[:2]) if len(targets) == 2 else (None, None)
    return {"description": f"small requests, {THROUGHPUT_CLIENTS} clients, the proxy with 1 and 2 workers (load "
                           f"generator and fake upstream pinned to CPU {sorted(pinned)[0]}, of {os.cpu_count()})",
            "metric": "throughput", "targets": rows,
            "scaling": None if not one or not two else two / one}


async def protocol_workload(bench: Bench, protocol: str, kind: str) -> dict[str, Any]:
    """small_1, stream_8 and large_4 as Messages, Responses or Gemini requests, on the same targets."""
    s = bench.sizes
    headers = dict(PROTOCOL_HEADERS[protocol])
    stream = kind == "stream"
    if stream:
        headers |= {"x-bench-chunks": str(s.stream_chunks), "x-bench-chunk-delay-ms": str(s.stream_delay_ms)}
    if kind == "large":
        body = agent_protocol_body(protocol, LONG_MODEL, seed=1000, turns=s.long_steps - 1, turn_tokens=1000)
        clients, count, what = 4, s.large_4, f"one ~{s.long_steps}k-token body, 4 clients"
    else:
        body = small_protocol_body(protocol, SMALL_MODEL, stream=stream)
        clients, count = (8, s.stream_8) if stream else (1, s.small_1)
        what = (f"streaming, {s.stream_chunks} events {s.stream_delay_ms:g} ms apart, 8 clients (figures: time to "
                "first event)") if stream else "small non-streaming request, 1 client"
    model = LONG_MODEL if kind == "large" else SMALL_MODEL
    req = Request(body, headers, path=protocol_path(protocol, model, stream=stream))
    await bench.warm(req, clients)
    tallies = await bench.interleaved(s.rounds, lambda t, r: run_load(t.port, [req], count=count, clients=clients))
    rows = summarize(tallies, metric="ttfb" if stream else "latency")
    if stream:
        for name, t in tallies.items():
            short = sum(1 for r in t.results if r.events != int(r.headers.get("x-bench-events", -1)))
            rows[name]["events_per_stream"] = s.stream_chunks
            rows[name]["streams_missing_events"] = short
            rows[name]["coalesced_events_pct"] = 100 * sum(max(0, r.events - r.reads) for r in t.results) / max(1, t.n * s.stream_chunks)
            if short:
                bench.problems.append(f"{protocol}_{kind}: {short} {name} streams lost events")
    # "-": no x-compaction-status, the route is relayed as a pass-through on this proxy
    bench.expect_status(f"{protocol}_{kind}", tallies.get(PROXY), {"none", "-"})
    return {"description": f"{protocol.capitalize()} {req.path}: {what}", "metric": "ttfb" if stream else "latency",
            "targets": rows, "protocol": protocol}


async def big_body(bench: Bench) -> dict[str, Any]:
    """Small requests every 20 ms while 40 MB requests (tool outputs of megabytes of logs, images)
    are processed, on each build of the proxy in turn: the small ones' p99 (issue 39's target)."""
    rows: dict[str, Any] = {}
    small = small_body(SMALL_MODEL)
    bodies = [big_body_stall.big_body(BIG_MB, seed, SMALL_MODEL) for seed in range(bench.sizes.big_bodies)]
    if bench.spy is not None and not bench.spy.running:  # --profile
        bench.spy.start()
    for t in (t for t in bench.targets if t.proxy):
        pids = lambda t=t: [t.server.popen.pid, *procs.children(t.server.popen.pid)]  # noqa: E731  (its worker process)
        rows[t.name] = await big_body_stall.stall(t.port, bodies, small, pids=pids)
    return {"description": f"small requests every 20 ms while {len(bodies)} requests of {BIG_MB} MB are processed, "
                           "one after the other (proxy builds only)", "metric": "stall", "targets": rows}


def upstream_stats(upstream: procs.Server) -> dict[str, int]:
    with urllib.request.urlopen(f"http://{procs.LOOPBACK}:{upstream.port}/bench/stats", timeout=10) as r:
        return json.loads(r.read())


async def wait_streams_closed(upstream: procs.Server, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if upstream_stats(upstream)["open_streams"] == 0:
            return True
        await asyncio.sleep(0.1)
    return False


RUNNERS: dict[str, Callable[[Bench], Awaitable[dict[str, Any]]]] = {
    "small_1": lambda b: small(b, 1, b.sizes.small_1),
    "small_16": lambda b: small(b, 16, b.sizes.small_16),
    "long_conv": long_conv,
    "large_4": large_4,
    "reused": reused,
    "crossing": crossing,
    "stream_8": stream_8,
    "stream_8_spread": lambda b: stream_8(b, spread=True),
    "memory": memory,
    "throughput": throughput,
    **{name: (lambda b, p=name.split("_")[0], k=name.split("_")[1]: protocol_workload(b, p, k)) for name in PROTOCOL_WORKLOADS},
    "zones": zones.zones,
    "prepare_repeat": zones.prepare_repeat,
    "big_body": big_body,
}


# -- orchestration --------------------------------------------------------------------------------


def start_servers(
    workdir: Path, sizes: Sizes, *, store: str, nginx: bool, proxy_env: dict[str, str], compare_metrics: bool = False,
    also: dict[str, Path] | None = None,
) -> tuple[procs.Server, list[Target]]:
    upstream = procs.start_fake_upstream(workdir, chunks=sizes.stream_chunks, chunk_delay_ms=sizes.stream_delay_ms)
    started = [upstream]
    try:
        targets = [Target(DIRECT, upstream.port, upstream)]
        forwarder = procs.start_bare_forwarder(workdir, upstream.port)
        started.append(forwarder)
        targets.append(Target(BASELINE, forwarder.port, forwarder))
        if nginx and (ng := procs.start_nginx(workdir, upstream.port)) is not None:
            started.append(ng)
            targets.append(Target(NGINX, ng.port, ng))
        models = {SMALL_MODEL: 128_000, LONG_MODEL: LONG_WINDOW, REUSED_MODEL: sizes.reused_window,
                  CROSS_MODEL: CROSS_WINDOW}
        proxy = procs.start_proxy(workdir, upstream.port, models=models, store=store, extra_env=proxy_env)
        started.append(proxy)
        targets.append(Target(PROXY, proxy.port, proxy, proxy=True))
        for name, tree in (also or {}).items():  # another build, measured in the same rounds
            command = [str(tree / ".venv" / "bin" / "compaction-proxy")]
            other = procs.start_proxy(workdir, upstream.port, models=models, store=store, extra_env=proxy_env, name=name,
                                      command=command)
            started.append(other)
            targets.append(Target(name, other.port, other, proxy=True, command=command))
        if compare_metrics:
            off = {"COMPACTION_PROXY_METRICS__ENABLED": "false"}
            for name, env in ((NO_METRICS, off), (NO_OPS, {**off, "COMPACTION_PROXY_SERVER__ACCESS_LOG": "false"})):
                bare = procs.start_proxy(workdir, upstream.port, models=models, store=store,
                                         extra_env={**proxy_env, **env}, name=name)
                started.append(bare)
                targets.append(Target(name, bare.port, bare))
    except BaseException:
        for s in reversed(started):
            s.stop()
        raise
    return upstream, targets


def raise_fd_limit() -> None:
    """Idle-stream runs hold thousands of sockets; children inherit the raised limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=procs.REPO, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


async def run_all(bench: Bench, names: list[str], *, profile: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    proxy = bench.target(PROXY)
    for name in names:
        t0 = time.monotonic()
        print(f"== {name}", file=sys.stderr, flush=True)
        if profile and proxy is not None:
            RESULTS_DIR.mkdir(exist_ok=True)
            bench.spy = Profiler(proxy.server.popen.pid, RESULTS_DIR / f"profile-{name}.txt")
        try:
            out[name] = await RUNNERS[name](bench)
        except LoadError as e:
            bench.problems.append(f"{name}: {e}")
        finally:
            spy, bench.spy = bench.spy, None
            profiled = spy is not None and spy.stop()
        if name not in out:
            continue
        out[name]["seconds"] = time.monotonic() - t0
        if profiled:
            assert spy is not None
            out[name]["profile"] = {"file": str(spy.out), **top_functions(spy.out)}
        dead = [t.name for t in bench.targets if not t.server.alive()]
        if dead:
            bench.problems.append(f"{name}: {', '.join(dead)} exited")
            break
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Benchmark the proxy against direct, a bare forwarder and nginx.")
    p.add_argument("--quick", action="store_true", help="smoke run (< 60 s): small sizes, same workloads")
    p.add_argument("--only", help=f"comma-separated workloads: {', '.join(WORKLOADS)}")
    p.add_argument("--store", choices=("sqlite", "memory"), default="sqlite", help="the proxy's store (default sqlite, a temp file)")
    p.add_argument("--no-nginx", action="store_true", help="skip nginx even when installed")
    p.add_argument("--profile", action="store_true",
                   help="sample the proxy with py-spy during each workload (perturbs the figures)")
    p.add_argument("--compare-metrics", action="store_true",
                   help=f"also run the proxy with metrics.enabled false (target {NO_METRICS!r}) and with the access "
                        f"log off too ({NO_OPS!r}): the cost of metrics and of the access log")
    p.add_argument("--also", action="append", default=[], metavar="NAME=WORKTREE",
                   help="also run the proxy built in WORKTREE (its .venv's console script) as target NAME, in the "
                        "same interleaved rounds: a before/after comparison of two commits on one machine load")
    p.add_argument("--proxy-env", action="append", default=[], metavar="NAME=VALUE",
                   help="extra environment variable for the proxy process (repeatable)")
    p.add_argument("--out", type=Path, help="JSON results file (default bench/results/<time>.json)")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.only.split(",")] if args.only else [
        n for n in WORKLOADS if not (args.quick and n in SLOW)]
    if unknown := [n for n in names if n not in RUNNERS]:
        p.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    args.names = names
    if bad := [e for e in args.proxy_env if "=" not in e]:
        p.error(f"--proxy-env needs NAME=VALUE, got {bad[0]!r}")
    args.proxy_env = dict(e.split("=", 1) for e in args.proxy_env)
    if bad := [e for e in args.also if "=" not in e or not (Path(e.split("=", 1)[1]) / ".venv" / "bin" / "compaction-proxy").exists()]:
        p.error(f"--also needs NAME=WORKTREE with a .venv/bin/compaction-proxy in it, got {bad[0]!r}")
    args.also = {n: Path(t) for n, t in (e.split("=", 1) for e in args.also)}
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = QUICK if args.quick else FULL
    raise_fd_limit()
    install_uvloop()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        workdir = Path(tmp)
        os.chmod(workdir, 0o755)  # nginx workers run as another user
        try:
            upstream, targets = start_servers(workdir, sizes, store=args.store, nginx=not args.no_nginx,
                                              proxy_env=args.proxy_env, compare_metrics=args.compare_metrics,
                                              also=args.also)
        except procs.StartError as e:
            print(f"bench: {e}", file=sys.stderr)
            return 1
        bench = Bench(targets, upstream, sizes, workdir=workdir, store=args.store, proxy_env=args.proxy_env)
        try:
            results = asyncio.run(run_all(bench, args.names, profile=args.profile))
        finally:
            for t in reversed(targets):
                t.server.stop()
    doc = {
        "meta": {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "quick": args.quick, "store": args.store,
                 "cpus": os.cpu_count(), "python": platform.python_version(), "commit": git_commit(),
                 "targets": [t.name for t in targets], "seconds": time.monotonic() - started,
                 "profiled": args.profile, "proxy_env": args.proxy_env},
        "workloads": results,
        "problems": bench.problems,
    }
    doc["targets_check"] = report.check_targets(results)
    print(report.render(doc))
    path = write_results(doc, args.out)
    print(f"\nresults: {path}")
    if bench.problems:
        print("\nBENCHMARK BROKEN:\n  " + "\n  ".join(bench.problems), file=sys.stderr)
        return 1
    return 0


def write_results(doc: dict[str, Any], out: Path | None) -> Path:
    """To `out` when given; else a timestamped file in bench/results/ and latest[-quick].json there."""
    text = json.dumps(doc, indent=1)
    if out is not None:
        out.write_text(text)
        return out
    RESULTS_DIR.mkdir(exist_ok=True)
    suffix = "-quick" if doc["meta"]["quick"] else ""
    path = RESULTS_DIR / f"{time.strftime('%Y%m%d-%H%M%S')}{suffix}.json"
    path.write_text(text)
    (RESULTS_DIR / f"latest{suffix}.json").write_text(text)
    return path


if __name__ == "__main__":
    sys.exit(main())
