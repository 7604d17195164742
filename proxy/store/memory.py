"""In-process store: the reference implementation of the contract, used by tests and `memory://`.

Nothing is shared between processes and nothing survives a restart.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from dataclasses import dataclass

from .base import Clock, Store


@dataclass(slots=True)
class _Entry:
    value: bytes
    ttl_s: float
    last_used: float


class MemoryStore(Store):
    def __init__(self, *, ttl_s: float, max_records: int, clock: Clock = time.time) -> None:
        super().__init__(ttl_s=ttl_s, max_records=max_records, clock=clock)
        # Expiring keys, least recently used first; only these count towards max_records.
        self._lru: OrderedDict[str, _Entry] = OrderedDict()
        self._permanent: dict[str, bytes] = {}
        self._logs: dict[str, deque[tuple[float, bytes]]] = {}

    def _live(self, key: str, now: float) -> bytes | None:
        """The key's value unless absent or expired (an expired entry is dropped on sight)."""
        if key in self._permanent:
            return self._permanent[key]
        entry = self._lru.get(key)
        if entry is None:
            return None
        if now - entry.last_used >= entry.ttl_s:
            del self._lru[key]
            return None
        return entry.value

    async def get_many(self, keys: list[str]) -> dict[str, bytes]:
        now = self.clock()
        found: dict[str, bytes] = {}
        for key in keys:
            value = self._live(key, now)
            if value is None:
                continue
            found[key] = value
            entry = self._lru.get(key)
            if entry is not None:
                entry.last_used = now
                self._lru.move_to_end(key)
        return found

    def _set(self, key: str, value: bytes, ttl_s: float | None, now: float) -> None:
        self._lru.pop(key, None)
        self._permanent.pop(key, None)
        if ttl_s is None:
            self._permanent[key] = value
            return
        self._lru[key] = _Entry(value, ttl_s, now)
        while len(self._lru) > self.max_records:
            self._lru.popitem(last=False)

    async def put(self, key: str, value: bytes, ttl_s: float | None = ...) -> None:  # type: ignore[assignment]
        self._set(key, value, self._ttl(ttl_s), self.clock())

    async def add(self, key: str, value: bytes, ttl_s: float | None = ...) -> bool:  # type: ignore[assignment]
        now = self.clock()
        if self._live(key, now) is not None:
            return False
        self._set(key, value, self._ttl(ttl_s), now)
        return True

    async def append(self, name: str, value: bytes, max_len: int) -> None:
        log = self._logs.get(name)
        if log is None or log.maxlen != max_len:
            log = self._logs[name] = deque(log or (), maxlen=max_len)
        log.append((self.clock(), value))

    async def tail(self, name: str, n: int) -> list[tuple[float, bytes]]:
        since = self.clock() - self.ttl_s
        live = [e for e in self._logs.get(name, ()) if e[0] > since]
        return live[-n:] if n > 0 else []

    async def delete(self, key: str, expected: bytes | None = None) -> bool:
        value = self._live(key, self.clock())
        if value is None or (expected is not None and value != expected):
            return False
        self._lru.pop(key, None)
        self._permanent.pop(key, None)
        return True
