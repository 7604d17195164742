"""How long the event loop was held: a task that ticks every few milliseconds and records the
largest gap between two of its ticks. A request whose work runs on the loop for seconds shows as
a gap of seconds; work in a worker thread, or bounded work, leaves every gap small.

    async with LoopProbe() as probe:
        await post(proxy, body, auth())
    assert probe.worst_s < STALL_BOUND_S, probe

LOOP_PROBE_PRINT=1 (with pytest -s) prints each probe's figure. The bound is on the loop's own
gaps, not on how long the request took: a slow machine makes the request slower, not its gaps
seconds long.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from typing import Any

TICK_S = 0.002
# 100 ms is the nominal budget; on 2 loaded cores shared by parallel test runs (and the GIL a worker
# thread holds between its switches) a gap of a few hundred ms happens without any defect, while
# the stalls these tests guard against are seconds long.
STALL_BOUND_S = 0.5


class LoopProbe:
    def __init__(self) -> None:
        self.worst_s = 0.0
        self.ticks = 0
        self._task: asyncio.Task[None] | None = None
        self._last = time.perf_counter()

    async def _tick(self) -> None:
        self._last = time.perf_counter()
        while True:
            await asyncio.sleep(TICK_S)
            self._gap()
            self.ticks += 1

    def _gap(self) -> None:
        now = time.perf_counter()
        self.worst_s = max(self.worst_s, now - self._last - TICK_S)
        self._last = now

    async def __aenter__(self) -> "LoopProbe":
        # The test process's own heap (pytest, the SDKs, the fakes: ~300k objects) would make each
        # full collection a pause of up to a second; a proxy process freezes its startup heap
        # (proxy/serve.py), so the probe measures with this one frozen too. What the request
        # allocates is collected as usual.
        gc.freeze()
        self._task = asyncio.get_running_loop().create_task(self._tick())
        await asyncio.sleep(0)  # the first tick's clock starts before the work does
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._task is not None
        # The gap still open counts too: a stall that ends as the request does is cancelled with
        # the ticker before it could tick again.
        self._gap()
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        finally:
            gc.unfreeze()
            if os.environ.get("LOOP_PROBE_PRINT"):  # the figures for a report: pytest -s
                print(self)

    def __repr__(self) -> str:
        return f"LoopProbe(worst gap {self.worst_s * 1000:.0f} ms over {self.ticks} ticks)"
