"""Freed memory given back to the system after large work (glibc's `malloc_trim`).

A large body (a 100k-token history, a 5 MB one) is read, parsed and written in many pieces that
are freed when its request ends; glibc keeps the freed pages in its heap for later allocations,
so the process's RSS stays at its high-water mark: measured after the benchmark's large-body
workloads, 70 MB of a 300 MB RSS was such free heap. `trim_soon()` asks glibc to return it, once,
a moment after the last large piece of work of a burst (`offload.sized` calls it), in a worker thread
(ctypes lets go of the GIL; glibc locks each arena only while it trims it). Other C libraries
(musl, macOS) have no `malloc_trim`: nothing is done there.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from typing import Any, Callable

log = logging.getLogger("proxy.heap")

DELAY_S = 1.0  # this long without large work ends a burst of it


def _libc(symbol: str, *argtypes: Any) -> Callable[..., int] | None:
    """A C library function returning an int, or None where the C library has no such function
    (musl, macOS: glibc's `malloc_trim` and `mallopt` are glibc's own)."""
    name = ctypes.util.find_library("c")
    try:
        fn = getattr(ctypes.CDLL(name), symbol) if name else None
    except (OSError, AttributeError):
        return None
    if fn is not None:
        fn.argtypes, fn.restype = list(argtypes), ctypes.c_int
    return fn


def _libc_trim() -> Callable[[int], int] | None:
    return _libc("malloc_trim", ctypes.c_size_t)


class Trimmer:
    """One trim once large work has stopped for `delay_s`: while large requests keep coming, the
    heap they free is the heap the next ones use, and trimming it would only make them fault it
    back in."""

    def __init__(self, delay_s: float = DELAY_S, trim: Callable[[int], int] | None = None) -> None:
        self.delay_s = delay_s
        self._trim = trim
        self._pending: asyncio.TimerHandle | asyncio.Future[int] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop `_pending` lives on
        self._last = 0.0  # loop time of the latest large work
        self.trims = 0  # trims done (the tests read it)

    @property
    def available(self) -> bool:
        return self._trim is not None

    def soon(self) -> None:
        """Trim the heap once no large work has been done for `delay_s` (from now on)."""
        if self._trim is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a worker thread, a script): nothing to schedule on
        if loop is not self._loop:  # a new loop (tests run many): what the old one had pending never runs
            self._loop, self._pending = loop, None
        self._last = loop.time()
        if self._pending is None:
            self._pending = loop.call_at(self._last + self.delay_s, self._due, loop)

    def _due(self, loop: asyncio.AbstractEventLoop) -> None:
        if loop.time() < self._last + self.delay_s:  # more large work came meanwhile: wait for its end
            self._pending = loop.call_at(self._last + self.delay_s, self._due, loop)
            return
        assert self._trim is not None
        fut = loop.run_in_executor(None, self._trim, 0)
        self._pending = fut
        fut.add_done_callback(self._done)

    def _done(self, fut: "asyncio.Future[int]") -> None:
        self._pending = None
        if fut.cancelled():
            return
        if fut.exception() is not None:
            log.debug("malloc_trim failed: %s", fut.exception())
            return
        self.trims += 1

    def now(self) -> bool:
        """Trim at once, in this thread; whether the C library can."""
        if self._trim is None:
            return False
        self._trim(0)
        self.trims += 1
        return True


TRIMMER = Trimmer(trim=_libc_trim())


def trim_soon() -> None:
    TRIMMER.soon()


# Fixed allocator thresholds, set once at start. glibc's default ones adapt to the blocks freed: a
# process with a small heap then hands the top of it back after each burst of large bodies and
# faults it in again on the next (measured on the bare aiohttp forwarder: ~200 minor page faults a
# 100k-token request, half its CPU). Fixed, blocks up to 32 MiB come from the heap and up to 64 MiB
# may stay free at its top between bursts; `trim_soon` still hands all of it back once large work
# stops. (The benchmark starts every server with the same values: bench/procs.py ALLOCATOR_ENV.)
MMAP_THRESHOLD = 32 << 20  # glibc's largest allowed value
TRIM_THRESHOLD = 64 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)


def _libc_mallopt() -> Callable[[int, int], int] | None:
    return _libc("mallopt", ctypes.c_int, ctypes.c_int)


def configure(mallopt: Callable[[int, int], int] | None = None) -> bool:
    """Set the fixed thresholds (once, at start, before any worker is forked: they inherit them);
    whether the C library took both (musl and macOS have no such settings: nothing is done)."""
    fn = mallopt if mallopt is not None else _libc_mallopt()
    if fn is None:
        return False
    ok = fn(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok = fn(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    if not ok:
        log.debug("mallopt refused the allocator thresholds")
    return ok
