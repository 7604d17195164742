"""The one rule for work that grows with a request's size: above `OFFLOAD_BYTES` it runs in a
worker thread, so one very large request (tens of megabytes to parse, hash, count, scan for
identifiers) never stalls the event loop, and with it every other request. Below it, the work is
cheaper than the hop to a thread and stays on the loop.

Callers pass the size of what the work reads (a body's bytes, a span's characters); every such
pass in the request path goes through `sized`.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, TypeVar

from proxy import heap

T = TypeVar("T")

OFFLOAD_BYTES = 256 * 1024
# Work that copies bytes (a body spliced from the JSON written at parse) costs about this many
# times less a byte than work that reads them in Python: `sized(len(body) // COPY_SHARE, ...)`.
COPY_SHARE = 16
# Scanning text for identifiers costs up to ~1 us a character (dense, distinct short tokens: 155 KB
# in 0.17 s), several times what parsing costs a byte: a scan counts each character this many times.
SCAN_WEIGHT = 4


async def sized(size: int, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """fn(*args, **kwargs): in a worker thread when `size` is over OFFLOAD_BYTES, else here."""
    if size > OFFLOAD_BYTES:
        return await elsewhere(fn, *args, **kwargs)
    return fn(*args, **kwargs)


async def elsewhere(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """fn(*args, **kwargs) in a worker thread: work already known to be large."""
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    finally:
        heap.trim_soon()  # what the large work allocated is freed soon: give it back to the system
