"""One summarizer call per summary, however many requests (and replicas) need it at once.

Within a process, callers of the same key share one task. Across replicas, the task first takes a
lock in the shared store (set-if-absent with an expiry); a replica that finds the lock taken polls
the store for the record until it appears, or until the lock is gone (holder died: the expiry frees
it) and it can take the lock itself. The task runs detached from the request that started it, so a
client that disconnects does not throw away a summary the next request will use.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Awaitable, Callable, Generic, TypeVar

from proxy.store.base import Store

T = TypeVar("T")
log = logging.getLogger("proxy.singleflight")


class SingleFlight(Generic[T]):
    def __init__(self, store: Store, *, lock_ttl_s: float, poll_s: float = 0.05) -> None:
        self.store = store
        self.lock_ttl_s = lock_ttl_s
        self.poll_s = poll_s
        self._tasks: dict[str, asyncio.Task[T]] = {}

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    async def run(
        self,
        key: str,
        make: Callable[[], Awaitable[T]],
        existing: Callable[[], Awaitable[T | None]],
    ) -> T:
        task = self._tasks.get(key)
        if task is None:
            task = asyncio.create_task(self._leader(key, make, existing), name=f"singleflight:{key[:24]}")
            self._tasks[key] = task
            task.add_done_callback(lambda t, k=key: self._done(k, t))
        # shield: a cancelled waiter (client gone) leaves the shared task running.
        return await asyncio.shield(task)

    def _done(self, key: str, task: asyncio.Task[T]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]
        if not task.cancelled():
            task.exception()  # mark retrieved; waiters got it already

    async def _leader(
        self, key: str, make: Callable[[], Awaitable[T]], existing: Callable[[], Awaitable[T | None]]
    ) -> T:
        lock_key = "lock:" + key
        token = os.urandom(12).hex().encode()
        while True:
            found = await existing()
            if found is not None:
                return found
            if await self.store.add(lock_key, token, self.lock_ttl_s):
                break
            if not getattr(self.store, "healthy", True):
                break  # store down: no lock to honour, make it ourselves
            await asyncio.sleep(self.poll_s)
        try:
            return await make()
        finally:
            await self.store.delete(lock_key, expected=token)

    async def cancel_all(self) -> None:
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
