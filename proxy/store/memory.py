"""In-process store: the reference implementation of the contract, used by tests and `memory://`.

Nothing is shared between processes and nothing survives a restart.
"""

from __future__ import annotations

import time
from collections import OrderedDict, defaultdict, deque
from dataclasses import dataclass, field
from typing import Sequence

from .base import Clock, Store, value_words


@dataclass(slots=True)
class _Entry:
    value: bytes
    ttl_s: float
    last_used: float
    terms: tuple[str, ...] = field(default=())  # an original's index entries ("i:"/"w:" + term)


class MemoryStore(Store):
    def __init__(self, *, ttl_s: float, max_records: int, clock: Clock = time.time) -> None:
        super().__init__(ttl_s=ttl_s, max_records=max_records, clock=clock)
        # Expiring keys, least recently used first; only these count towards max_records.
        self._lru: OrderedDict[str, _Entry] = OrderedDict()
        self._permanent: dict[str, bytes] = {}
        self._logs: dict[str, deque[tuple[float, bytes]]] = {}
        self._index: defaultdict[str, set[str]] = defaultdict(set)  # "i:"/"w:" + term -> original keys

    def _live(self, key: str, now: float) -> bytes | None:
        """The key's value unless absent or expired (an expired entry is dropped on sight)."""
        if key in self._permanent:
            return self._permanent[key]
        entry = self._lru.get(key)
        if entry is None:
            return None
        if now - entry.last_used >= entry.ttl_s:
            self._unindex(key, self._lru.pop(key))
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

    async def peek(self, key: str) -> bytes | None:
        return self._live(key, self.clock())

    def _set(self, key: str, value: bytes, ttl_s: float | None, now: float, terms: tuple[str, ...] = ()) -> None:
        self._drop(key)
        if ttl_s is None:
            self._permanent[key] = value
            return
        self._lru[key] = _Entry(value, ttl_s, now, terms)
        for t in terms:
            self._index[t].add(key)
        while len(self._lru) > self.max_records:
            self._unindex(*self._lru.popitem(last=False))

    def _drop(self, key: str) -> None:
        entry = self._lru.pop(key, None)
        if entry is not None:
            self._unindex(key, entry)
        self._permanent.pop(key, None)

    def _unindex(self, key: str, entry: _Entry) -> None:
        for t in entry.terms:
            keys = self._index.get(t)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._index[t]

    async def put_original(self, key: str, value: bytes, identifiers: Sequence[str],
                           words: Sequence[str] | None = None) -> None:
        words = await value_words(value) if words is None else words
        terms = (*(f"i:{i}" for i in dict.fromkeys(identifiers)), *(f"w:{w}" for w in words))
        self._set(key, value, self.ttl_s, self.clock(), terms)

    async def find_originals(
        self, prefix: str, words: Sequence[str], identifiers: Sequence[str], limit: int
    ) -> list[str]:
        now = self.clock()
        score: dict[str, float] = {}
        for terms, weight in ((identifiers, 1000.0), (words, 1.0)):
            for t in dict.fromkeys(terms):
                for key in self._index.get(("i:" if weight > 1 else "w:") + t, ()):
                    if key.startswith(prefix):
                        score[key] = score.get(key, 0.0) + weight
        live = [k for k in score if (e := self._lru.get(k)) is not None and now - e.last_used < e.ttl_s]
        # best first; among equals the most recently used
        order = {k: i for i, k in enumerate(self._lru)}
        live.sort(key=lambda k: (-score[k], -order[k]))
        return live[:limit]

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
        self._drop(key)
        return True
