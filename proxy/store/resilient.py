"""A store wrapper that never lets the store fail a request.

Reuse of summaries is an optimisation: when the backend is down the proxy carries on without it,
and says so once. Reads then find nothing, writes store nothing and `add` refuses (so nobody
believes they hold a lock). An outage is logged as one warning when it starts and one info line
when a call succeeds again; `.healthy` tells the current state (`ping()` refreshes it).
Log lines name only the backend class and the error, never keys or values.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import TypeVar

from .base import Store, StoreUnavailable

T = TypeVar("T")

log = logging.getLogger("proxy.store")


class ResilientStore(Store):
    def __init__(self, inner: Store) -> None:
        super().__init__(ttl_s=inner.ttl_s, max_records=inner.max_records, clock=inner.clock)
        self.inner = inner
        self.healthy = True
        self._kind = type(inner).__name__

    async def _guard(self, call: Awaitable[T], fallback: T) -> T:
        try:
            result = await call
        except Exception as e:  # StoreUnavailable, or a backend bug: neither may fail a request
            reason = str(e) if isinstance(e, StoreUnavailable) else f"{type(e).__name__}: {e}"
            if self.healthy:
                self.healthy = False
                log.warning("store %s unavailable, carrying on without reuse: %s", self._kind, reason)
            else:
                log.debug("store %s still unavailable: %s", self._kind, reason)
            return fallback
        if not self.healthy:
            self.healthy = True
            log.info("store %s available again", self._kind)
        return result

    async def get_many(self, keys: list[str]) -> dict[str, bytes]:
        return await self._guard(self.inner.get_many(keys), {})

    async def get(self, key: str) -> bytes | None:
        return await self._guard(self.inner.get(key), None)

    async def put(self, key: str, value: bytes, ttl_s: float | None = ...) -> None:  # type: ignore[assignment]
        await self._guard(self.inner.put(key, value, ttl_s), None)

    async def add(self, key: str, value: bytes, ttl_s: float | None = ...) -> bool:  # type: ignore[assignment]
        return await self._guard(self.inner.add(key, value, ttl_s), False)

    async def delete(self, key: str, expected: bytes | None = None) -> bool:
        return await self._guard(self.inner.delete(key, expected), False)

    async def ping(self) -> None:
        await self._guard(self.inner.ping(), None)

    async def close(self) -> None:
        await self._guard(self.inner.close(), None)
