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
A worker that dies on its own is started again. One that died early (within START_GRACE_S of its
start: a start-up failure, or a crash that comes back at once) is started again after a back-off
that doubles with each early death of its slot in a row (0.5 s, 1, 2, 4); the fifth early death
in a row means restarts keep failing (about ten seconds of trying): then the supervisor stops the
others and exits with an error. A worker that lived past the grace starts its slot's count anew.

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

START_GRACE_S = 5.0  # a worker that exits sooner than this after its start died early
EARLY_DEATHS = 5  # early deaths of one slot in a row that end the supervisor
BACKOFF_S = 0.5  # the first restart's delay after an early death; doubled for each one after
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
        self.procs: list[tuple[Any, float]] = []  # (process or None during a back-off, monotonic start time)
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

        streaks = [0] * len(self.procs)  # early deaths in a row, per slot
        due: dict[int, float] = {}  # slot -> when its next worker starts (a back-off under way)
        while not self.stopping:
            live = [p.sentinel for p, _ in self.procs if p is not None and p.is_alive()]
            wait = min([POLL_S, *(max(0.0, t - time.monotonic()) for t in due.values())])
            multiprocessing.connection.wait(live, timeout=wait)
            for i, (p, started) in enumerate(self.procs):
                if self.stopping:
                    break
                if p is None:  # waiting out its back-off
                    if time.monotonic() >= due[i]:
                        del due[i]
                        self.procs[i] = self._start()
                    continue
                if p.is_alive():
                    continue
                p.join()
                multiprocess.mark_process_dead(p.pid, self.metrics_dir)  # its live gauges (in flight) leave the sums
                lived = time.monotonic() - started
                streaks[i] = streaks[i] + 1 if lived < START_GRACE_S else 0
                delay = restart_delay(streaks[i])
                if delay is None:
                    log.error("worker %d exited with %s within %g s of its start, %d times in a row: stopping",
                              p.pid, p.exitcode, START_GRACE_S, streaks[i])
                    self.failed = self.stopping = True
                    break
                log.warning("worker %d exited with %s after %.1f s: starting another%s", p.pid, p.exitcode, lived,
                            f" in {delay:g} s" if delay else "")
                self.procs[i] = (None, started)
                due[i] = time.monotonic() + delay

    def _stop(self) -> int:
        """SIGTERM to every worker, then wait for each to drain (killed past grace + margin)."""
        running = [p for p, _ in self.procs if p is not None]  # (a slot in its back-off has none)
        for p in running:
            if p.is_alive():
                os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.cfg.server.shutdown_grace_s + STOP_MARGIN_S
        clean = not self.failed
        for p in running:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                log.error("worker %d did not stop in time: killed", p.pid)
                p.kill()
                p.join()
            if p.exitcode != 0:
                log.error("worker %d ended with exit code %s", p.pid, p.exitcode)
                clean = False
        return 0 if clean else 1


def restart_delay(early_deaths: int) -> float | None:
    """How long to wait before starting a slot's next worker after its `early_deaths`-th early
    death in a row (0: it lived past the grace, start one at once); None: give up."""
    if early_deaths >= EARLY_DEATHS:
        return None
    return BACKOFF_S * 2 ** (early_deaths - 1) if early_deaths else 0.0


def run_workers(cfg: Config, count: int) -> int:
    return Supervisor(cfg, count).run()
