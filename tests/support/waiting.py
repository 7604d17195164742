"""Waiting for a condition, not for a time: a test that sleeps a fixed while and then looks fails
on a loaded machine (CI runs on 2 busy cores), so it polls until the condition holds, failing only
past a deadline generous enough that only a hang reaches it.

    await until(lambda: upstream.disconnects == 1, "the upstream to see the client leave")
    until_sync(lambda: "started" in replica.log_text(), "the start line")
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

DEADLINE_S = 30.0
POLL_S = 0.02


async def until(cond: Callable[[], object], what: str, timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        await asyncio.sleep(POLL_S)


def until_sync(cond: Callable[[], object], what: str, timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(POLL_S)
