"""Freed memory goes back to the system after large work (proxy/heap.py): glibc's malloc_trim,
once, a moment after a burst of large offloaded work; nothing after small work."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from proxy import heap, offload
from support.waiting import DEADLINE_S, until

pytestmark = pytest.mark.skipif(not heap.TRIMMER.available, reason="the C library has no malloc_trim")


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_trim_returns_the_free_pages_inside_the_heap() -> None:
    # 2 KB pieces come from malloc's heap; keeping one in 64 leaves holes it cannot give back by itself.
    pieces = [bytes(2000) for _ in range(40_000)]
    kept = pieces[::64]
    del pieces
    before = rss_mb()
    assert heap.TRIMMER.now()
    after = rss_mb()
    assert before - after > 30, (before, after)
    assert len(kept) == 625


class LoopClock:
    """The running loop's clock, moved only by the test: the trimmer's delay is measured on it, so a
    loaded machine running the test slowly cannot stretch a burst's gaps past the delay."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        loop = asyncio.get_running_loop()
        self.now = loop.time()
        monkeypatch.setattr(loop, "time", lambda: self.now)

    async def advance(self, seconds: float) -> None:
        """Move the clock on, then let the loop run the timers now due (it resumes this task
        before the timers it finds due, so twice)."""
        self.now += seconds
        await asyncio.sleep(0)
        await asyncio.sleep(0)


async def trimmed(n: int) -> None:
    """Until the trimmer has done `n` trims: one that is due runs in a worker thread. (The loop's
    clock stands still: yield to the loop rather than sleep on a timer of it.)"""
    deadline = time.monotonic() + DEADLINE_S
    while heap.TRIMMER.trims < n:
        assert time.monotonic() < deadline, f"{heap.TRIMMER.trims} trims, not {n}"
        await asyncio.sleep(0)
        time.sleep(0.001)


async def test_large_offloaded_work_is_followed_by_one_trim(monkeypatch) -> None:
    monkeypatch.setattr(heap, "TRIMMER", heap.Trimmer(0.3, heap.TRIMMER._trim))
    clock = LoopClock(monkeypatch)
    start = heap.TRIMMER.trims
    await offload.sized(10, len, b"small")
    await clock.advance(0.5)
    assert heap.TRIMMER.trims == start  # small work: nothing to give back
    for _ in range(6):  # a burst of large work, longer than the delay: one trim, after its end
        await offload.sized(offload.OFFLOAD_BYTES + 1, len, b"x" * 10)
        await clock.advance(0.1)
        assert heap.TRIMMER.trims == start
    await clock.advance(0.25)  # past the delay since the last of it (not onto it: float sums)
    await trimmed(start + 1)
    await clock.advance(0.5)
    assert heap.TRIMMER.trims == start + 1
    await offload.sized(offload.OFFLOAD_BYTES + 1, len, b"x")  # later large work: trimmed again
    await clock.advance(0.35)
    await trimmed(start + 2)
    assert heap.TRIMMER.trims == start + 2


def test_a_trim_left_pending_on_a_closed_loop_does_not_block_the_next_loop() -> None:
    trimmer = heap.Trimmer(0.05, heap.TRIMMER._trim)

    async def large_work(until_trimmed: bool) -> None:
        trimmer.soon()
        if until_trimmed:
            await until(lambda: trimmer.trims == 1, "the trim on the second loop")

    asyncio.run(large_work(False))  # the loop ends before its trim is due
    assert trimmer.trims == 0
    asyncio.run(large_work(True))
    assert trimmer.trims == 1


# Four 1 MiB blocks allocated, written and freed, round after round: the benchmark's four clients'
# large bodies, in C so that nothing else allocates in between. Prints the minor page faults of
# the last rounds.
BURSTS = """
import ctypes, resource, sys
from proxy import heap
if sys.argv[1] == "configured":
    assert heap.configure()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
def burst():
    blocks = [libc.malloc(1 << 20) for _ in range(4)]
    for b in blocks:
        libc.memset(b, 1, 1 << 20)
    for b in blocks:
        libc.free(b)
for _ in range(2):
    burst()
start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    burst()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
"""


def faults_of_bursts(mode: str) -> int:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", BURSTS, mode], capture_output=True, text=True, timeout=60, check=True)
    return int(out.stdout.strip())


def test_fixed_thresholds_keep_a_burst_of_large_blocks_in_the_heap() -> None:
    """glibc's adaptive thresholds give the heap's top back after each burst and fault it in again
    on the next (4 MiB: ~1,000 faults a burst); the fixed ones keep it."""
    assert faults_of_bursts("default") > 5 * 500
    assert faults_of_bursts("configured") < 100


def test_configure_sets_both_thresholds_and_says_whether_they_were_taken() -> None:
    calls: list[tuple[int, int]] = []
    assert heap.configure(lambda p, v: calls.append((p, v)) or 1)
    assert calls == [(-3, heap.MMAP_THRESHOLD), (-1, heap.TRIM_THRESHOLD)]
    assert not heap.configure(lambda p, v: 0)  # refused (an older glibc's limit): the defaults stay
