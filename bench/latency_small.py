"""Added latency of one small non-streaming request: through the proxy vs direct (or vs a bare
forwarder), for a chat completion or an Anthropic Messages request.

    python bench/latency_small.py [--n 500] [--warmup 50] [--protocol chat|messages] [--baseline direct|bare]

Starts the fast fake upstream (bench/fake_upstream.py), the real proxy (the installed
`compaction-proxy` console script, so uvloop) and, with `--baseline bare`, the bare forwarder
(bench/bare_forwarder.py: the least an aiohttp proxy can do) as their own processes on loopback,
then sends N sequential requests to the baseline and to the proxy with one plain aiohttp client
(keep-alive connection per target),
interleaved: every round sends one request to each target, in an order that alternates every round,
so that drift on the machine hurts both alike. Prints median / p90 / p99 of each side, the added
median, and the median of the per-round differences. Prints figures; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # `python bench/latency_small.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp  # noqa: E402

from bench import procs  # noqa: E402
from bench.fake_upstream import install_uvloop  # noqa: E402

# protocol -> (path, body, headers)
REQUESTS = {
    "chat": ("/v1/chat/completions",
             b'{"model":"gpt-4o-mini","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Say hi"}]}',
             {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}),
    "messages": ("/v1/messages",
                 b'{"model":"claude-sonnet-4-6","max_tokens":64,"system":"Be brief.","messages":[{"role":"user","content":"Say hi"}]}',
                 {"Content-Type": "application/json", "x-api-key": "sk-ant-bench", "anthropic-version": "2023-06-01"}),
}
BODY, HEADERS = REQUESTS["chat"][1], REQUESTS["chat"][2]


async def _one(session: aiohttp.ClientSession, url: str, want_proxy_header: bool) -> float:
    t0 = time.perf_counter()
    async with session.post(url, data=BODY, headers=HEADERS) as r:
        await r.read()
        elapsed = time.perf_counter() - t0
        if r.status != 200 or want_proxy_header != ("x-compaction-status" in r.headers):
            raise RuntimeError(f"unexpected answer from {url}: {r.status}")
    return elapsed


def _pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


async def measure(direct_url: str, proxy_url: str, n: int, warmup: int, baseline: str = "direct") -> dict[str, list[float]]:
    times: dict[str, list[float]] = {baseline: [], "proxy": []}
    connector = aiohttp.TCPConnector(limit_per_host=1)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(warmup):
            await _one(session, direct_url, False)
            await _one(session, proxy_url, True)
        for i in range(n):
            order = [(baseline, direct_url, False), ("proxy", proxy_url, True)]
            if i % 2:
                order.reverse()
            for name, url, flag in order:
                times[name].append(await _one(session, url, flag))
    return times


def report(times: dict[str, list[float]]) -> None:
    ms = {k: [x * 1000 for x in v] for k, v in times.items()}
    print(f"{'target':8} {'n':>5} {'median':>9} {'p90':>9} {'p99':>9} {'mean':>9}  (ms)")
    for name, xs in ms.items():
        print(f"{name:8} {len(xs):5d} {statistics.median(xs):9.3f} {_pct(xs, 90):9.3f} {_pct(xs, 99):9.3f} "
              f"{statistics.fmean(xs):9.3f}")
    base = next(k for k in ms if k != "proxy")
    added = statistics.median(ms["proxy"]) - statistics.median(ms[base])
    paired = statistics.median(p - d for p, d in zip(ms["proxy"], ms[base]))
    print(f"added latency: median(proxy) - median({base}) = {added:.3f} ms; median of per-round differences = "
          f"{paired:.3f} ms")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--n", type=int, default=500, help="requests per target (sequential)")
    p.add_argument("--warmup", type=int, default=50, help="unmeasured requests per target first")
    p.add_argument("--protocol", choices=sorted(REQUESTS), default="chat", help="the request sent")
    p.add_argument("--baseline", choices=("direct", "bare"), default="direct",
                   help="what the proxy is compared with: the upstream itself, or the bare forwarder in front of it")
    args = p.parse_args(argv)
    global BODY, HEADERS
    path, BODY, HEADERS = REQUESTS[args.protocol]
    install_uvloop()
    with tempfile.TemporaryDirectory(prefix="latency-small-") as tmp:
        workdir = Path(tmp)
        upstream = procs.start_fake_upstream(workdir, chunks=8, chunk_delay_ms=0)
        try:
            proxy = procs.start_proxy(workdir, upstream.port, models={}, store="memory")
            bare = procs.start_bare_forwarder(workdir, upstream.port) if args.baseline == "bare" else None
            try:
                times = asyncio.run(measure(
                    f"http://{procs.LOOPBACK}:{(bare or upstream).port}{path}",
                    f"http://{procs.LOOPBACK}:{proxy.port}{path}",
                    args.n, args.warmup, args.baseline,
                ))
            finally:
                proxy.stop()
                if bare is not None:
                    bare.stop()
        finally:
            upstream.stop()
    report(times)


if __name__ == "__main__":
    main()
