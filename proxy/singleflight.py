"""One summarizer call per summary, however many requests (and replicas) need it at once.

Within a process, callers of the same key share one task: its result, or its exception, reaches
every one of them. Across replicas, the task first takes a lock in the shared store (set-if-absent
with an expiry); a replica that finds the lock taken polls the store for the record until it
appears, or until the lock is gone and it can take the lock itself. While it works, the holder
keeps its lock alive by reading it (a read refreshes a key's expiry, see proxy/store/base.py), so
the expiry can be short: a replica that dies holding the lock blocks the others for about one
`lock_ttl_s`, while a live one keeps it however long its summary takes.

When the store is down there is no lock to honour: the task makes the value itself instead of
polling a store that cannot answer. The task runs detached from the request that started it, so
a client that disconnects does not throw away a summary the next request will use.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Awaitable, Callable, Generic, TypeVar

from proxy.store.base import Store

T = TypeVar("T")
log = logging.getLogger("proxy.singleflight")

HEARTBEATS_PER_TTL = 3  # refresh the lock this often per expiry: two missed beats still hold it


class SingleFlight(Generic[T]):
    def __init__(self, store: Store, *, lock_ttl_s: float, poll_s: float = 0.05) -> None:
        self.store = store
        self.lock_ttl_s = lock_ttl_s
        self.poll_s = poll_s
        self._tasks: dict[str, asyncio.Task[T]] = {}

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def running(self, key: str) -> bool:
        """Whether this process is working on (or waiting for) `key` now."""
        return key in self._tasks

    async def join(self, key: str) -> T | None:
        """The result of the call for `key` running in this process, once it is done (its
        exception if it fails); None when none is running."""
        task = self._tasks.get(key)
        return None if task is None else await asyncio.shield(task)

    async def run(
        self,
        key: str,
        make: Callable[[], Awaitable[T]],
        existing: Callable[[], Awaitable[T | None]],
    ) -> T:
        """The value for `key`: `existing()` when it finds one, else the one `make()` returns,
        made once for all concurrent callers here and on the other replicas."""
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
            task.exception()  # mark retrieved: the waiters got it already, or none is left

    def _healthy(self) -> bool:
        return getattr(self.store, "healthy", True)

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
            if not self._healthy():
                return await make()  # no store, no lock to wait for: make it here
            await asyncio.sleep(self.poll_s)
        # The holder we waited for may have stored the record and released the lock between our
        # last look and our taking it: look once more before making it again.
        found = await existing()
        if found is not None:
            await self.store.delete(lock_key, expected=token)
            return found
        heartbeat = asyncio.create_task(self._keep_lock(lock_key, token), name=f"lock-heartbeat:{key[:24]}")
        try:
            return await make()
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            await self.store.delete(lock_key, expected=token)

    async def _keep_lock(self, lock_key: str, token: bytes) -> None:
        """Refresh the lock's expiry while the holder works; stop once it is no longer ours."""
        while True:
            await asyncio.sleep(self.lock_ttl_s / HEARTBEATS_PER_TTL)
            held = await self.store.get(lock_key)
            if held != token and self._healthy():
                # Expired (this process stalled for a whole TTL) and maybe taken by another
                # replica: carry on; at worst this summary is made twice.
                log.info("lost the lock on a summary in progress; another replica may make it too")
                return

    async def cancel_all(self) -> None:
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
