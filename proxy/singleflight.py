"""One summarizer call per summary, however many requests (and replicas) need it at once.

Within a process, callers of the same key share one task: its result, or its exception, reaches
every one of them. Across replicas, the task first takes a lock in the shared store (set-if-absent
with an expiry); a replica that finds the lock taken polls the store for the record until it
appears, or until the lock is gone and it can take the lock itself. Waiters look at a lock with
`peek`, which refreshes nothing: only its holder's writes keep it alive.

A lock names its owner (host, process id, and a random id for this process's life) and carries a
heartbeat: the holder rewrites the lock with the time of its latest beat every `heartbeat_s`.
A waiter that sees no beat for two beats and a half takes the lock over (a holder that died, was
SIGKILLed or froze), so a dead holder costs others a few seconds, not the lock's whole expiry,
which remains only as the last resort. A process that starts clears the locks its own previous
life left behind (`clear_dead_locks`: same host, and its process gone or the same pid in a new
life, as in a restarted container).

No caller waits longer than `max_wait_s` for a value someone else is making (another request's
task here, or another replica's lock): past it, `Busy` is raised and the request goes on without.
The caller whose own task makes the value waits for it (the summarizer's own timeout bounds that).

When the store is down there is no lock to honour: the task makes the value itself instead of
polling a store that cannot answer. The task runs detached from the request that started it, so
a client that disconnects does not throw away a summary the next request will use.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from typing import Any, Awaitable, Callable, Generic, TypeVar

import orjson

from proxy.store.base import Store

T = TypeVar("T")
log = logging.getLogger("proxy.singleflight")

LOCK_PREFIX = "lock:"
MISSED_BEATS = 2.5  # a lock whose last beat is older than this many beats is taken over
# Who this process is: the pid alone repeats across container restarts (always 1), the life id never.
OWNER = {"host": socket.gethostname(), "pid": os.getpid(), "life": os.urandom(8).hex()}
# A forked worker (server.workers) is a life of its own.
os.register_at_fork(after_in_child=lambda: OWNER.update(pid=os.getpid(), life=os.urandom(8).hex()))


class Busy(Exception):
    """Someone else is making this value and did not finish within max_wait_s."""


def _lock_value(token: str, beat: float, every: float) -> bytes:
    return orjson.dumps({**OWNER, "token": token, "beat": beat, "every": every})


def _parse_lock(raw: bytes) -> dict[str, Any] | None:
    try:
        lock = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None  # a lock written by an older version: only its expiry frees it
    return lock if isinstance(lock, dict) else None


def _ours(raw: bytes | None, token: str) -> bool:
    """Whether a lock as read (None: none) is the one this holder took."""
    return raw is not None and (_parse_lock(raw) or {}).get("token") == token


def stopped_beating(raw: bytes, now: float) -> bool:
    """Whether a lock's holder missed two beats (and a half, for slack) by `now`."""
    lock = _parse_lock(raw)
    if lock is None or not isinstance(lock.get("beat"), (int, float)) or not isinstance(lock.get("every"), (int, float)):
        return False
    return now - lock["beat"] > MISSED_BEATS * lock["every"]


def left_by_a_dead_life(raw: bytes) -> bool:
    """A lock from this host whose process is gone, or from this very pid in an earlier life."""
    lock = _parse_lock(raw)
    if lock is None or lock.get("host") != OWNER["host"] or not isinstance(lock.get("pid"), int):
        return False
    if lock.get("life") == OWNER["life"]:
        return False
    if lock["pid"] == OWNER["pid"]:
        return True
    try:
        os.kill(lock["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, someone else's
    return False


async def clear_dead_locks(store: Store) -> int:
    """Delete the locks a previous life of this process left in the store (start-up); returns how
    many. Only backends that can list keys take part (SQLite: the file outlives the process)."""
    cleared = 0
    for key, raw in (await store.scan(LOCK_PREFIX)).items():
        if left_by_a_dead_life(raw) and await store.delete(key, expected=raw):
            cleared += 1
    if cleared:
        log.info("cleared %d summary locks left by a previous run of this process", cleared)
    return cleared


class SingleFlight(Generic[T]):
    def __init__(
        self,
        store: Store,
        *,
        lock_ttl_s: float,
        heartbeat_s: float = 2.0,
        max_wait_s: float | None = None,
        poll_s: float = 0.05,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.lock_ttl_s = lock_ttl_s
        self.heartbeat_s = heartbeat_s
        self.max_wait_s = max_wait_s
        self.poll_s = poll_s
        self.clock = clock  # wall time: beats are compared across processes
        self._tasks: dict[str, asyncio.Task[T]] = {}

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def running(self, key: str) -> bool:
        """Whether this process is working on (or waiting for) `key` now."""
        return key in self._tasks

    async def join(self, key: str) -> T | None:
        """The result of the call for `key` running in this process, once it is done (its
        exception if it fails; Busy past max_wait_s); None when none is running."""
        task = self._tasks.get(key)
        return None if task is None else await self._wait(task)

    async def _wait(self, task: asyncio.Task[T]) -> T:
        """Someone else's task: at most max_wait_s. shield: a waiter that gives up (or whose client
        leaves) leaves the shared task running."""
        try:
            return await asyncio.wait_for(asyncio.shield(task), self.max_wait_s)
        except asyncio.TimeoutError:
            raise Busy(f"a summary in progress did not finish within {self.max_wait_s:g} s") from None

    async def run(
        self,
        key: str,
        make: Callable[[], Awaitable[T]],
        existing: Callable[[], Awaitable[T | None]],
    ) -> T:
        """The value for `key`: `existing()` when it finds one, else the one `make()` returns,
        made once for all concurrent callers here and on the other replicas."""
        task = self._tasks.get(key)
        if task is not None:
            return await self._wait(task)
        task = asyncio.create_task(self._leader(key, make, existing), name=f"singleflight:{key[:24]}")
        self._tasks[key] = task
        task.add_done_callback(lambda t, k=key: self._done(k, t))
        # Our own task: waited for in full (a lock it waits on is bounded inside _leader).
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
        lock_key = LOCK_PREFIX + key
        token = os.urandom(12).hex()
        loop = asyncio.get_running_loop()
        give_up = None if self.max_wait_s is None else loop.time() + self.max_wait_s
        next_check = 0.0
        while True:
            found = await existing()
            if found is not None:
                return found
            if await self.store.add(lock_key, _lock_value(token, self.clock(), self.heartbeat_s), self.lock_ttl_s):
                break
            if not self._healthy():
                return await make()  # no store, no lock to wait for: make it here
            now = loop.time()
            if now >= next_check:  # not on every poll: one more read per beat is plenty
                next_check = now + self.heartbeat_s / 2
                held = await self.store.peek(lock_key)
                if held is not None and stopped_beating(held, self.clock()):
                    log.info("taking over a summary lock whose holder stopped its heartbeat")
                    await self.store.delete(lock_key, expected=held)
                    continue
            if give_up is not None and now >= give_up:
                raise Busy(f"another process's summary did not finish within {self.max_wait_s:g} s")
            await asyncio.sleep(self.poll_s)
        # The holder we waited for may have stored the record and released the lock between our
        # last look and our taking it: look once more before making it again.
        found = await existing()
        if found is not None:
            await self._release(lock_key, token)
            return found
        heartbeat = asyncio.create_task(self._keep_lock(lock_key, token), name=f"lock-heartbeat:{key[:24]}")
        try:
            return await make()
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            await self._release(lock_key, token)

    async def _release(self, lock_key: str, token: str) -> None:
        held = await self.store.peek(lock_key)
        if _ours(held, token):
            await self.store.delete(lock_key, expected=held)

    async def _keep_lock(self, lock_key: str, token: str) -> None:
        """Beat while the holder works: rewrite the lock with the time, while it is still ours."""
        while True:
            await asyncio.sleep(self.heartbeat_s)
            if _ours(await self.store.peek(lock_key), token):
                await self.store.put(lock_key, _lock_value(token, self.clock(), self.heartbeat_s), self.lock_ttl_s)
            elif self._healthy():
                # Taken over (this process stalled for two beats) and maybe by another replica:
                # carry on; at worst this summary is made twice.
                log.info("lost the lock on a summary in progress; another replica may make it too")
                return

    async def cancel_all(self) -> None:
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
