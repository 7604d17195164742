"""Instructions a request spends in one phase, under valgrind's callgrind: the proxy or the bare
forwarder, one protocol's small request (streamed by default), one client.

    python bench/phases.py --target proxy --protocol responses --phase first
    python bench/phases.py --target bare --protocol chat --phase pre --requests 600

Wall-clock figures on a shared machine are noise; instruction counts are not. The phases
(`bench/phase_probe.py`): `first` (a request's arrival to its answer's first body write: what a
stream's first event waits for in the process), `pre` (arrival to the upstream request's start:
the request side), `answer` (the upstream's answer headers to the first body write: the stream's
start), `all` (everything after the warm-up). One keep-alive connection sends the requests one
after another with a pause between them (`--think-ms`), so that the previous answer's tail (its
log line, metrics, bill) is over before the next request arrives and stays out of the phase; the
fake upstream's events come 50 ms apart, so that the first read carries the first event alone
(under callgrind the benchmark's 2 ms pile up).

Needs valgrind and a C compiler with valgrind's headers (`valgrind/callgrind.h`): the probe's
helper is compiled into a temporary directory. Takes minutes (callgrind runs the server ~50x
slower); prints the phase's instructions per request and the callgrind file (for
callgrind_annotate).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent))

from bench import procs  # noqa: E402
from bench.loadgen import DEFAULT_HEADERS, Request  # noqa: E402
from bench.phase_probe import PHASES  # noqa: E402
from bench.workloads import GEMINI_KEY, protocol_path, small_protocol_body  # noqa: E402

HELPER_C = """#include <valgrind/callgrind.h>
void cg_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
void cg_instrument(void) { CALLGRIND_START_INSTRUMENTATION; }
"""
PROTOCOLS = ("chat", "messages", "responses", "gemini")
PROTOCOL_HEADERS = {"messages": {"anthropic-version": "2023-06-01"}, "gemini": GEMINI_KEY}
MODEL = "bench-small"


def build_helper(workdir: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or shutil.which("valgrind") is None:
        raise SystemExit("phases.py needs valgrind and a C compiler (with valgrind's headers)")
    src, lib = workdir / "cg_toggle.c", workdir / "libcgtoggle.so"
    src.write_text(HELPER_C)
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


def request_bytes(req: Request, port: int) -> bytes:
    headers = {**DEFAULT_HEADERS, **req.headers, "Host": f"{procs.LOOPBACK}:{port}", "Content-Length": str(len(req.body))}
    head = "\r\n".join([f"POST {req.path} HTTP/1.1"] + [f"{k}: {v}" for k, v in headers.items()])
    return (head + "\r\n\r\n").encode("latin-1") + req.body


async def one_by_one(port: int, req: Request, count: int, think_s: float) -> list[tuple[int, dict[str, str]]]:
    """`count` requests on one connection, each after the previous answer ended and a pause; each
    answer's status and headers."""
    reader, writer = await asyncio.open_connection(procs.LOOPBACK, port)
    raw = request_bytes(req, port)
    out = []
    try:
        for _ in range(count):
            writer.write(raw)
            lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if ":" in line)}
            if "content-length" in headers:
                await reader.readexactly(int(headers["content-length"]))
            else:  # chunked: up to the last chunk
                body = b""
                while not body.endswith(b"0\r\n\r\n"):
                    part = await reader.read(65536)
                    if not part:
                        raise ConnectionError("the server closed the connection mid-answer")
                    body += part
            out.append((int(lines[0].split()[1]), headers))
            await asyncio.sleep(think_s)
    finally:
        writer.close()
    return out


def total_instructions(path: Path) -> int:
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise SystemExit(f"no totals in {path}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--target", choices=("proxy", "bare"), default="proxy")
    p.add_argument("--protocol", choices=PROTOCOLS, default="chat")
    p.add_argument("--phase", choices=PHASES, default="first")
    p.add_argument("--requests", type=int, default=600, help="measured requests (>= 600 for stable figures)")
    p.add_argument("--warmup", type=int, default=100)
    # Events far apart: under callgrind the server runs ~50x slower, so events 2 ms apart (the
    # benchmark's) pile up and its first read carries several of them, all checked before the
    # first write (the phase would count them).
    p.add_argument("--chunks", type=int, default=4, help="events per stream")
    p.add_argument("--chunk-delay-ms", type=float, default=50.0)
    p.add_argument("--no-stream", action="store_true", help="a non-streaming request")
    p.add_argument("--think-ms", type=float, default=30.0)
    p.add_argument("--workdir", type=Path, default=None)
    args = p.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="phases-"))
    lib = build_helper(work)
    out = work / "callgrind.out"
    upstream = procs.start_fake_upstream(work, chunks=args.chunks, chunk_delay_ms=args.chunk_delay_ms)
    port = procs.free_port()
    # Instrumented from the first request on (the probe switches it on: the warm-up runs the code
    # the measured requests run); collection is the probe's to switch.
    valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
                f"--callgrind-out-file={out}"]
    probe = [sys.executable, str(BENCH_DIR / "phase_probe.py"), str(lib), args.phase, str(args.warmup)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_PROXY_")}
    env["PYTHONPATH"] = str(BENCH_DIR.parent)
    if args.target == "bare":
        argv_ = [*valgrind, *probe, str(BENCH_DIR / "bare_forwarder.py"), "--port", str(port),
                 "--upstream", f"http://{procs.LOOPBACK}:{upstream.port}"]
        server = procs.spawn("bare", argv_, port, work, env)
        ready = "/bench/stats"  # the fake's, through the forwarder: an answer, not only an open port
    else:
        config = {"server": {"host": procs.LOOPBACK, "port": port, "shutdown_grace_s": 1},
                  "upstream": {"base_url": f"http://{procs.LOOPBACK}:{upstream.port}/v1"},
                  "anthropic": {"base_url": f"http://{procs.LOOPBACK}:{upstream.port}"},
                  "gemini": {"base_url": f"http://{procs.LOOPBACK}:{upstream.port}"},
                  "models": {MODEL: {"context_window": 128_000}},
                  "store": {"url": f"sqlite:///{work / 'proxy.db'}"},
                  "compaction": {"learn_token_ratio": False, "mask_tool_outputs": False}}  # as bench/run.py's
        (work / "proxy.yaml").write_text(yaml.safe_dump(config))
        server = procs.spawn("proxy", [*valgrind, *probe, "proxy", "--config", str(work / "proxy.yaml")], port, work, env)
        ready = "/healthz"
    try:
        procs.wait_ready(server, path=ready, timeout_s=600)
        stream = not args.no_stream
        headers = dict(PROTOCOL_HEADERS.get(args.protocol, {}))
        if stream:
            headers |= {"x-bench-chunks": str(args.chunks), "x-bench-chunk-delay-ms": str(args.chunk_delay_ms)}
        req = Request(small_protocol_body(args.protocol, MODEL, stream=stream), headers, path=protocol_path(args.protocol, MODEL, stream=stream))
        think = args.think_ms / 1000
        asyncio.run(one_by_one(port, req, args.warmup, think))
        answers = asyncio.run(one_by_one(port, req, args.requests, think))
        subprocess.run(["callgrind_control", "-d", str(server.popen.pid)], check=True, capture_output=True)
        time.sleep(1)
    finally:
        server.stop()
        upstream.stop()
    dumps = sorted(work.glob("callgrind.out.*"), key=lambda f: int(re.sub(r"\D", "", f.suffix) or 0))
    if not dumps:
        raise SystemExit(f"callgrind wrote no dump in {work}:\n{server.log_tail()}")
    statuses = sorted({s for s, _ in answers})
    compaction = sorted({h.get("x-compaction-status", "-") for _, h in answers})
    per_request = total_instructions(dumps[0]) / args.requests
    print(f"{args.target} {args.protocol} {'stream' if stream else 'whole'} phase={args.phase}: "
          f"{per_request:,.0f} instructions a request over {args.requests} (statuses {statuses}, "
          f"x-compaction-status {compaction}); {dumps[0]}")
    return 0 if statuses == [200] else 1


if __name__ == "__main__":
    raise SystemExit(main())
