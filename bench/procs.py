"""The benchmark's server processes: start, wait until ready, read CPU time and RSS from /proc, stop.

Each server runs as its own process so that its CPU time is its own: utime + stime from
/proc/PID/stat (all threads of the process), read before and after a run.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
LOOPBACK = "127.0.0.1"


class StartError(Exception):
    """A server did not come up; the message ends with the tail of its log."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


# One allocator setting for every server process the benchmark starts (the forwarder, nginx, each
# proxy), so that a target's CPU per request does not depend on which workloads ran before it.
# With glibc's defaults (thresholds that adapt to the blocks freed) a freshly started bare forwarder
# returns the top of its heap to the system after each burst of large bodies (the 100k-token ones,
# 4 clients) and faults it back in on the next: ~200 minor page faults a request, more than half of
# its CPU time. Once other workloads (the 1,000 idle streams) have left its heap larger and
# fragmented, that stops and its CPU per request halves; the proxy's heap is that large from the
# start. Fixed thresholds (blocks up to 32 MiB from the heap, which keeps up to 64 MiB free at its
# top) measure every target in that steady state from its first request, in any order.
ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(64 << 20)}


def _stat(pid: int) -> list[bytes]:
    """/proc/PID/stat's fields from the 3rd (state) on."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()


SCHEDSTAT = os.path.exists(f"/proc/{os.getpid()}/schedstat")  # kernels built without it have utime/stime only


def cpu_seconds(pid: int) -> float:
    """CPU time of a process (every thread, user and kernel), in seconds: the scheduler's
    nanosecond figure per thread (/proc/PID/task/*/schedstat) where the kernel keeps it, else
    utime + stime. Those are counted in clock ticks (10 ms): a round of 500 small requests takes
    ~200 ms of CPU, so ticks alone would move a per-round ratio by up to ~5%. (A thread that ends
    between two readings takes its time with it; the servers measured here keep theirs.)"""
    if not SCHEDSTAT:
        fields = _stat(pid)
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[0])
        except FileNotFoundError:  # the thread ended after the listing
            continue
    return total / 1e9


def minor_faults(pid: int) -> int:
    """Minor page faults of a process so far (every thread): memory it touched for the first time,
    or again after giving it back."""
    return int(_stat(pid)[7])


def rss_mb(pid: int, key: str = "VmRSS") -> float:
    """Resident memory (or `VmHWM`, its peak) of a process, in MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def children(pid: int) -> list[int]:
    """Direct children of a process (nginx's workers), found by scanning /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            out.append(int(entry))
    return out


@dataclass
class Server:
    name: str
    port: int
    popen: subprocess.Popen[bytes]
    log: Path
    with_children: bool = False  # count the children's CPU and memory too (nginx's workers, the proxy's)

    @property
    def pids(self) -> list[int]:
        return [self.popen.pid] + (children(self.popen.pid) if self.with_children else [])

    def cpu(self) -> float:
        return sum(cpu_seconds(p) for p in self.pids)

    def faults(self) -> int:
        return sum(minor_faults(p) for p in self.pids)

    def rss(self, key: str = "VmRSS") -> float:
        return sum(rss_mb(p, key) for p in self.pids)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)


def spawn(name: str, argv: list[str], port: int, workdir: Path, env: dict[str, str] | None = None) -> Server:
    log = workdir / f"{name}.log"
    env = {**(os.environ if env is None else env), **ALLOCATOR_ENV}
    with open(log, "wb") as out:
        popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=workdir, env=env)
    return Server(name, port, popen, log)


def wait_ready(server: Server, *, path: str | None = None, timeout_s: float = 30.0) -> None:
    """Until the port accepts connections (and `path` answers 200); StartError on timeout or exit."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not server.alive():
            raise StartError(f"{server.name} exited with status {server.popen.returncode}:\n{server.log_tail()}")
        try:
            if path is None:
                with socket.create_connection((LOOPBACK, server.port), timeout=1):
                    return
            else:
                with urllib.request.urlopen(f"http://{LOOPBACK}:{server.port}{path}", timeout=2) as r:
                    if r.status == 200:
                        return
        except OSError:
            pass
        time.sleep(0.05)
    raise StartError(f"{server.name} not ready after {timeout_s:g} s:\n{server.log_tail()}")


def start_fake_upstream(workdir: Path, *, chunks: int, chunk_delay_ms: float) -> Server:
    port = free_port()
    argv = [sys.executable, str(BENCH_DIR / "fake_upstream.py"), "--port", str(port),
            "--chunks", str(chunks), "--chunk-delay-ms", str(chunk_delay_ms)]
    server = spawn("fake-upstream", argv, port, workdir)
    wait_ready(server)
    return server


def start_bare_forwarder(workdir: Path, upstream_port: int) -> Server:
    port = free_port()
    argv = [sys.executable, str(BENCH_DIR / "bare_forwarder.py"), "--port", str(port),
            "--upstream", f"http://{LOOPBACK}:{upstream_port}"]
    server = spawn("bare-forwarder", argv, port, workdir)
    wait_ready(server)
    return server


def proxy_command() -> list[str]:
    """The installed console script next to this interpreter, else `python -m proxy`."""
    script = Path(sys.executable).with_name("compaction-proxy")
    return [str(script)] if script.exists() else [sys.executable, "-m", "proxy"]


def start_proxy(
    workdir: Path, upstream_port: int, *, models: dict[str, int], store: str, extra_env: dict[str, str] | None = None,
    name: str = "proxy", command: list[str] | None = None,
) -> Server:
    """The real `compaction-proxy` console script with a config written to `workdir`.

    `models` maps model names to context windows; `store` is `memory` or `sqlite` (a file in workdir);
    `extra_env` is added to its environment (experiments such as allocator settings, or
    COMPACTION_PROXY_METRICS__ENABLED=false); `name` tells several proxies of one run apart;
    `command` runs another build of the proxy (another worktree's console script).
    """
    port = free_port()
    config = {
        "server": {"host": LOOPBACK, "port": port, "shutdown_grace_s": 1},
        "upstream": {"base_url": f"http://{LOOPBACK}:{upstream_port}/v1", "max_connections": 2000},
        "anthropic": {"base_url": f"http://{LOOPBACK}:{upstream_port}"},  # the same fake answers Messages
        "gemini": {"base_url": f"http://{LOOPBACK}:{upstream_port}"},  # and Gemini
        "models": {name: {"context_window": window} for name, window in models.items()},
        "store": {"url": "memory://" if store == "memory" else f"sqlite:///{workdir / (name + '.db')}"},
        # The fast fake answers a fixed `usage` (it counts nothing): no ratio to learn from it. The
        # crossing workload measures summaries prepared ahead, which masking old tool outputs would
        # make unnecessary in its tool-heavy conversations (bench/careless_replay.py measures tiers).
        "compaction": {"learn_token_ratio": False, "mask_tool_outputs": False},
    }
    cfg = workdir / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_PROXY_")}
    env.update(extra_env or {})
    server = spawn(name, (command or proxy_command()) + ["--config", str(cfg)], port, workdir, env)
    server.with_children = True  # its worker process for huge texts (and a supervisor's workers) is its CPU too
    wait_ready(server, path="/healthz", timeout_s=60)
    return server


NGINX_CONF = """
worker_processes 1;
worker_rlimit_nofile 16384;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {dir}/nginx-body;
    proxy_temp_path {dir}/nginx-proxy;
    fastcgi_temp_path {dir}/nginx-fastcgi;
    uwsgi_temp_path {dir}/nginx-uwsgi;
    scgi_temp_path {dir}/nginx-scgi;
    client_max_body_size 256m;
    client_body_buffer_size 16m;
    upstream fake {{ server {loopback}:{upstream_port}; keepalive 256; }}
    server {{
        listen {loopback}:{port} backlog=4096;
        location / {{
            proxy_pass http://fake;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""


def start_nginx(workdir: Path, upstream_port: int) -> Server | None:
    """nginx (one worker, no buffering) as a C reference point; None when it is not installed."""
    binary = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.path.exists(p)), None)
    if binary is None:
        return None
    port = free_port()
    conf = workdir / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=workdir, loopback=LOOPBACK, port=port, upstream_port=upstream_port))
    server = spawn("nginx", [binary, "-p", str(workdir), "-e", str(workdir / "nginx-error.log"), "-c", str(conf)],
                   port, workdir)
    server.with_children = True
    wait_ready(server)
    return server
