"""A store wrapper that never lets the store fail a request.

Reuse of summaries is an optimisation: when the backend is down the proxy carries on without it,
and says so once. Reads then find nothing, writes store nothing and `add` refuses (so nobody
believes they hold a lock). An outage is logged as one warning when it starts and one info line
when a call succeeds again; `.healthy` tells the current state (`ping()` refreshes it).
Log lines name only the backend class and the error, never keys or values.

During an outage the backend is not asked on every call: a backend that does not answer costs
each call its connect timeout, and a request makes several store calls. After a failure, calls
answer as a miss without touching the backend for `retry_after_s`; then one call at a time probes
it, and the first success ends the outage.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Sequence, TypeVar

from .base import Clock, OriginalRow, Store, StoreUnavailable

T = TypeVar("T")

log = logging.getLogger("proxy.store")

RETRY_AFTER_S = 1.0


class ResilientStore(Store):
    def __init__(
        self, inner: Store, *, retry_after_s: float = RETRY_AFTER_S, monotonic: Clock = time.monotonic
    ) -> None:
        super().__init__(ttl_s=inner.ttl_s, max_records=inner.max_records, clock=inner.clock)
        self.inner = inner
        self.healthy = True
        self.retry_after_s = retry_after_s
        self._monotonic = monotonic
        self._retry_at = 0.0  # while unhealthy: no backend call before this
        self._probing = False  # while unhealthy: one call is trying the backend
        self._kind = type(inner).__name__
        self.errors = 0  # failed backend calls since start (the metrics read it)

    @property
    def indexes_words(self) -> bool:  # type: ignore[override]
        return self.inner.indexes_words

    async def _guard(self, call: Callable[[], Awaitable[T]], fallback: T, *, probe: bool = False) -> T:
        """`call()`, or `fallback` when it fails or when backing off (`probe` calls always go out)."""
        trial = False
        if not self.healthy and not probe:
            if self._probing or self._monotonic() < self._retry_at:
                return fallback
            self._probing = trial = True
        try:
            result = await call()
        except Exception as e:  # StoreUnavailable, or a backend bug: neither may fail a request
            self._failed(e)
            return fallback
        finally:
            if trial:
                self._probing = False
        if not self.healthy:
            self.healthy = True
            log.info("store %s available again", self._kind)
        return result

    def _failed(self, e: Exception) -> None:
        reason = str(e) if isinstance(e, StoreUnavailable) else f"{type(e).__name__}: {e}"
        self.errors += 1
        self._retry_at = self._monotonic() + self.retry_after_s
        if self.healthy:
            self.healthy = False
            log.warning("store %s unavailable, carrying on without reuse: %s", self._kind, reason)
        else:
            log.debug("store %s still unavailable: %s", self._kind, reason)

    async def get_many(self, keys: list[str]) -> dict[str, bytes]:
        return await self._guard(lambda: self.inner.get_many(keys), {})

    async def get(self, key: str) -> bytes | None:
        return await self._guard(lambda: self.inner.get(key), None)

    async def peek(self, key: str) -> bytes | None:
        return await self._guard(lambda: self.inner.peek(key), None)

    async def put(self, key: str, value: bytes, ttl_s: float | None = ...) -> None:  # type: ignore[assignment]
        await self._guard(lambda: self.inner.put(key, value, ttl_s), None)

    async def add(self, key: str, value: bytes, ttl_s: float | None = ...) -> bool:  # type: ignore[assignment]
        return await self._guard(lambda: self.inner.add(key, value, ttl_s), False)

    async def delete(self, key: str, expected: bytes | None = None) -> bool:
        return await self._guard(lambda: self.inner.delete(key, expected), False)

    async def scan(self, prefix: str) -> dict[str, bytes]:
        return await self._guard(lambda: self.inner.scan(prefix), {})

    async def put_original(self, key: str, value: bytes, identifiers: Sequence[str],
                           words: Sequence[str] | None = None) -> None:
        await self._guard(lambda: self.inner.put_original(key, value, identifiers, words), None)

    async def put_originals(self, rows: Sequence[OriginalRow]) -> None:
        await self._guard(lambda: self.inner.put_originals(rows), None)

    async def find_originals(
        self, prefix: str, words: Sequence[str], identifiers: Sequence[str], limit: int
    ) -> list[str]:
        return await self._guard(lambda: self.inner.find_originals(prefix, words, identifiers, limit), [])

    async def append(self, name: str, value: bytes, max_len: int) -> None:
        await self._guard(lambda: self.inner.append(name, value, max_len), None)

    async def tail(self, name: str, n: int) -> list[tuple[float, bytes]]:
        return await self._guard(lambda: self.inner.tail(name, n), [])

    async def ping(self) -> None:
        """Ask the backend now, back-off or not: an explicit health check wants the current answer."""
        await self._guard(self.inner.ping, None, probe=True)

    async def close(self) -> None:
        await self._guard(self.inner.close, None, probe=True)
