"""Freed memory goes back to the system after large work (proxy/heap.py): glibc's malloc_trim,
once, a moment after a burst of large offloaded work; nothing after small work."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from proxy import heap, offload

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


async def wait_for_trims(n: int, timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while heap.TRIMMER.trims < n and loop.time() < end:
        await asyncio.sleep(0.01)


async def test_large_offloaded_work_is_followed_by_one_trim(monkeypatch) -> None:
    monkeypatch.setattr(heap, "TRIMMER", heap.Trimmer(0.3, heap.TRIMMER._trim))
    start = heap.TRIMMER.trims
    await offload.sized(10, len, b"small")
    await asyncio.sleep(0.5)
    assert heap.TRIMMER.trims == start  # small work: nothing to give back
    for _ in range(6):  # a burst of large work, longer than the delay: one trim, after its end
        await offload.sized(offload.OFFLOAD_BYTES + 1, len, b"x" * 10)
        await asyncio.sleep(0.1)
        assert heap.TRIMMER.trims == start
    await wait_for_trims(start + 1)
    await asyncio.sleep(0.5)
    assert heap.TRIMMER.trims == start + 1
    await offload.sized(offload.OFFLOAD_BYTES + 1, len, b"x")  # later large work: trimmed again
    await wait_for_trims(start + 2)
    assert heap.TRIMMER.trims == start + 2


def test_a_trim_left_pending_on_a_closed_loop_does_not_block_the_next_loop() -> None:
    trimmer = heap.Trimmer(0.05, heap.TRIMMER._trim)

    async def large_work(wait_s: float) -> None:
        trimmer.soon()
        await asyncio.sleep(wait_s)

    asyncio.run(large_work(0))  # the loop ends before its trim is due
    assert trimmer.trims == 0
    asyncio.run(large_work(1.0))
    assert trimmer.trims == 1
