"""Work over huge texts in a worker *process*: the one place the proxy's own CPU leaves the
interpreter that serves its event loop.

A worker thread (proxy/offload.py) keeps the event loop ticking while a large request is parsed
and counted, but not free: the thread holds the interpreter lock in turns of 5 ms, and each time
the loop thread gives it up (every socket read, write and poll) it waits for its next turn. With
seconds of regular expressions over a 40 MB request's tool outputs in a thread, a small request
on the same process waited up to a few hundred milliseconds. Extraction over a text of more than
FARM_CHARS (its identifiers and error lines, an original's index words and code symbols, a sample
of its tokens) runs here instead, in a process of its own with its own interpreter; only the
text read goes there (at most its head and tail, identifiers.SCAN_CHARS) and only the small
result comes back (docs/reliability.md § Bounded work on the event loop).

The pool is started by the first such text (none for ordinary traffic: a summarized span of many
messages is read message by message, each in this process), holds at most
MAX_WORKERS processes, and is killed by `close()` at shutdown. A pool that cannot start, that
broke, or that keeps a call past TIMEOUT_S answers with the work done here, as before it existed.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import threading
from concurrent.futures import CancelledError, ProcessPoolExecutor, TimeoutError
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, TypeVar

T = TypeVar("T")
log = logging.getLogger("proxy.farm")

# Texts over this many characters go to the process: ~0.25 s of scanning, where the hop costs a
# copy of the text and a millisecond. A tool output under the tool-result threshold is far smaller.
FARM_CHARS = 1 << 18
# One process: huge texts are rare, and a second would take a core from the loop's process.
MAX_WORKERS = 1
# What a call may wait for the process (its start and the text's work take a second or two): a
# worker that hangs is killed and the text's work done here, so no request waits on it for ever.
TIMEOUT_S = 30.0


def _quiet() -> None:
    """A worker's start: Ctrl-C in the proxy's terminal reaches the whole process group; the
    proxy stops its workers itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Farm:
    """A lazily started, bounded process pool for pure functions of one large argument."""

    def __init__(self, max_workers: int = MAX_WORKERS) -> None:
        self.max_workers = max_workers
        self.calls = 0  # calls sent to a process (the tests count them)
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _get(self) -> ProcessPoolExecutor | None:
        with self._lock:
            if self._pool is None:
                try:  # (spawn: a fork of a process with threads and a running loop is unsafe)
                    self._pool = ProcessPoolExecutor(self.max_workers, multiprocessing.get_context("spawn"),
                                                     initializer=_quiet)
                except (OSError, ValueError) as e:
                    log.warning("no worker process for huge texts (%s): extraction runs here", e)
                    return None
            return self._pool

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) in the worker process, waiting for it (called from a worker thread: the wait
        holds no lock); here when the pool cannot serve."""
        pool = self._get()
        if pool is not None:
            try:
                future = pool.submit(fn, *args)
                self.calls += 1
                return future.result(TIMEOUT_S)
            except (BrokenProcessPool, CancelledError, RuntimeError, TimeoutError) as e:  # killed, closed, hung
                log.warning("the worker process for huge texts failed (%r): this one is done here", e)
                self._drop(pool)
        return fn(*args)

    def sized(self, chars: int, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args): in the worker process when it reads more than FARM_CHARS characters."""
        return self.call(fn, *args) if chars > FARM_CHARS else fn(*args)

    def _drop(self, pool: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is pool:
                self._pool = None
        _kill(pool)

    def close(self) -> None:
        """Kill the workers (what they were doing is answered here by `call`'s fallback)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            _kill(pool)


def _kill(pool: ProcessPoolExecutor) -> None:
    processes = list((getattr(pool, "_processes", None) or {}).values())  # (no public way before 3.14)
    pool.shutdown(wait=False, cancel_futures=True)
    for p in processes:
        p.kill()
    for p in processes:
        p.join(5)


# One per process, as the text caches: who asks does not change what a text holds.
farm = Farm()
