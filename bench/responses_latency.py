"""Added latency of a small Responses request and of a WebSocket turn: direct, through the bare
forwarder (the baseline: aiohttp doing nothing but relay) and through the proxy.

    python bench/responses_latency.py [--n 500] [--warmup 50]

Starts the fast Responses upstream (bench/responses_upstream.py), the bare forwarder and the real
proxy (the installed console script, so uvloop) as their own processes on loopback. HTTP: N small
non-streaming `POST /v1/responses`, one keep-alive connection per target. WebSocket: one socket per
target held open, N turns each (a `response.create`, then its events up to `response.completed`).
Rounds alternate the targets (the order rotates) so that drift on the machine hurts them alike.
Prints median / p90 / p99 per target and the proxy's added median against direct and against the
bare forwarder. Prints figures; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # `python bench/responses_latency.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp  # noqa: E402

from bench import procs  # noqa: E402
from bench.fake_upstream import install_uvloop  # noqa: E402

BODY = {"model": "bench-small", "instructions": "Be brief.", "input": [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hi"}]}]}
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}
TARGETS = ("direct", "bare", "proxy")


async def http_turn(session: aiohttp.ClientSession, url: str) -> float:
    t0 = time.perf_counter()
    async with session.post(url, data=json.dumps(BODY), headers=HEADERS) as r:
        await r.read()
        if r.status != 200:
            raise RuntimeError(f"unexpected answer from {url}: {r.status}")
    return time.perf_counter() - t0


async def ws_turn(ws: aiohttp.ClientWebSocketResponse) -> float:
    t0 = time.perf_counter()
    await ws.send_str(json.dumps({"type": "response.create", **BODY}))
    while True:
        msg = await ws.receive()
        if msg.type != aiohttp.WSMsgType.TEXT:
            raise RuntimeError(f"socket ended: {msg}")
        if json.loads(msg.data)["type"] == "response.completed":
            return time.perf_counter() - t0


async def measure(bases: dict[str, str], n: int, warmup: int) -> dict[str, dict[str, list[float]]]:
    out = {kind: {t: [] for t in TARGETS} for kind in ("http", "ws")}
    # A socket holds its connection: the sockets get a session of their own, so the HTTP requests
    # keep one keep-alive connection per target.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit_per_host=1)) as session, \
            aiohttp.ClientSession() as ws_session:
        sockets = {t: await ws_session.ws_connect(bases[t].replace("http", "ws", 1) + "/responses", headers=HEADERS)
                   for t in TARGETS}
        try:
            for i in range(warmup + n):
                order = list(TARGETS[i % 3:] + TARGETS[:i % 3])
                for t in order:
                    h = await http_turn(session, bases[t] + "/responses")
                    w = await ws_turn(sockets[t])
                    if i >= warmup:
                        out["http"][t].append(h)
                        out["ws"][t].append(w)
        finally:
            for ws in sockets.values():
                await ws.close()
    return out


def _pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def report(times: dict[str, dict[str, list[float]]]) -> None:
    for kind, label in (("http", "small POST /v1/responses"), ("ws", "WebSocket turn")):
        ms = {t: [x * 1000 for x in v] for t, v in times[kind].items()}
        print(f"\n{label}")
        print(f"{'target':8} {'n':>5} {'median':>9} {'p90':>9} {'p99':>9}  (ms)")
        for t, xs in ms.items():
            print(f"{t:8} {len(xs):5d} {statistics.median(xs):9.3f} {_pct(xs, 90):9.3f} {_pct(xs, 99):9.3f}")
        med = {t: statistics.median(xs) for t, xs in ms.items()}
        print(f"proxy added: {med['proxy'] - med['direct']:.3f} ms vs direct, "
              f"{med['proxy'] - med['bare']:.3f} ms vs the bare forwarder "
              f"(bare forwarder itself: {med['bare'] - med['direct']:.3f} ms vs direct)")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--n", type=int, default=500, help="turns per target and kind")
    p.add_argument("--warmup", type=int, default=50)
    args = p.parse_args(argv)
    install_uvloop()
    with tempfile.TemporaryDirectory(prefix="responses-latency-") as tmp:
        workdir = Path(tmp)
        port = procs.free_port()
        upstream = procs.spawn("responses-upstream", [sys.executable, str(procs.BENCH_DIR / "responses_upstream.py"),
                                                      "--port", str(port)], port, workdir)
        servers = [upstream]
        try:
            procs.wait_ready(upstream)
            bare = procs.start_bare_forwarder(workdir, upstream.port)
            servers.append(bare)
            proxy = procs.start_proxy(workdir, upstream.port, models={}, store="memory")
            servers.append(proxy)
            bases = {t: f"http://{procs.LOOPBACK}:{s.port}/v1" for t, s in zip(TARGETS, servers)}
            times = asyncio.run(measure(bases, args.n, args.warmup))
        finally:
            for s in reversed(servers):
                s.stop()
    report(times)


if __name__ == "__main__":
    main()
