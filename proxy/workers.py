"""`server.workers` > 1: that many proxy processes on one port, and the supervisor that runs them.

Each worker is a full proxy (its own event loop, upstream connections and summary tasks) with its
own listening socket on the same address (SO_REUSEPORT): the kernel spreads new connections over
them, so no process accepts for the others. They share what the store holds (SQLite's file in WAL
mode, or Redis), and single-flight across them goes through the store's lock as it does across
replicas. Their Prometheus metrics go to one directory of per-process files that /metrics sums,
whichever worker answers it (proxy/ops/metrics.py).

The supervisor reserves the port before forking (so port 0 resolves once, and a port in use is
one error, not one per worker), forwards SIGTERM/SIGINT to every worker (each drains as a single
proxy does: stop listening, `shutdown_grace_s` for requests in flight) and exits when all have.
A worker that dies on its own is started again, unless it died right after starting (a start-up
failure would only repeat): then the supervisor stops the others and exits with an error.

A worker is forked with SIGTERM and SIGINT blocked, and serve() unblocks them once its loop handles
them: a stop that comes while a worker is still starting waits for it and drains it (exit 0)
instead of killing it with the default action halfway through its start.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import tempfile
import time
from typing import Any

from proxy.config import Config
from proxy.serve import STOP_SIGNALS

log = logging.getLogger("proxy")

START_GRACE_S = 5.0  # a worker that exits sooner than this after its start failed to start
STOP_MARGIN_S = 10.0  # beyond the shutdown grace: a worker still running then is killed
POLL_S = 0.5


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound (not listening) to the address with SO_REUSEPORT: it resolves port 0 and
    keeps the port ours while workers come and go; it never receives a connection itself."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def _worker(cfg: Config, metrics_dir: str) -> None:
    """One worker process: the single-process proxy, listening with SO_REUSEPORT."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the supervisor's handlers are not ours; serve() installs its own
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    from proxy.ops.metrics import share_metrics

    share_metrics(metrics_dir)
    from proxy.app import create_app
    from proxy.serve import serve

    asyncio.run(serve(create_app(cfg), cfg, reuse_port=True))


class Supervisor:
    def __init__(self, cfg: Config, count: int) -> None:
        self.cfg = cfg
        self.count = count
        self.ctx = multiprocessing.get_context("fork")  # nothing runs yet: no loop, no thread to fork
        self.procs: list[tuple[Any, float]] = []  # (process, monotonic start time)
        self.stopping = False
        self.failed = False
        self.metrics_dir = ""

    def _start(self) -> tuple[Any, float]:
        p = self.ctx.Process(target=_worker, args=(self.cfg, self.metrics_dir), name="compaction-proxy-worker")
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # the child inherits it: see the docstring
        try:
            p.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        return p, time.monotonic()

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def run(self) -> int:
        """Serve with `count` workers until SIGTERM/SIGINT; 0 when all of them stopped cleanly.
        Raises OSError when the address cannot be bound."""
        s = self.cfg.server
        reserved = reserve_port(s.host, s.port)
        try:
            port = reserved.getsockname()[1]
            self.cfg = self.cfg.model_copy(update={"server": s.model_copy(update={"port": port})})
            self.metrics_dir = tempfile.mkdtemp(prefix="compaction-proxy-metrics-")
            previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
            try:
                self.procs = [self._start() for _ in range(self.count)]
                log.info("%d workers on port %d (pids %s)", self.count, port, " ".join(str(p.pid) for p, _ in self.procs))
                self._watch()
                return self._stop()
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
        finally:
            reserved.close()
            if self.metrics_dir:
                shutil.rmtree(self.metrics_dir, ignore_errors=True)

    def _watch(self) -> None:
        from prometheus_client import multiprocess

        while not self.stopping:
            multiprocessing.connection.wait([p.sentinel for p, _ in self.procs], timeout=POLL_S)
            for i, (p, started) in enumerate(self.procs):
                if p.is_alive() or self.stopping:
                    continue
                p.join()
                multiprocess.mark_process_dead(p.pid, self.metrics_dir)  # its live gauges (in flight) leave the sums
                if time.monotonic() - started < START_GRACE_S:
                    log.error("worker %d exited with %s right after starting: stopping", p.pid, p.exitcode)
                    self.failed = True
                    self.stopping = True
                    break
                log.warning("worker %d exited with %s: starting another", p.pid, p.exitcode)
                self.procs[i] = self._start()

    def _stop(self) -> int:
        """SIGTERM to every worker, then wait for each to drain (killed past grace + margin)."""
        for p, _ in self.procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.cfg.server.shutdown_grace_s + STOP_MARGIN_S
        clean = not self.failed
        for p, _ in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                log.error("worker %d did not stop in time: killed", p.pid)
                p.kill()
                p.join()
            if p.exitcode != 0:
                log.error("worker %d ended with exit code %s", p.pid, p.exitcode)
                clean = False
        return 0 if clean else 1


def run_workers(cfg: Config, count: int) -> int:
    return Supervisor(cfg, count).run()
