"""Summary records: the only code that reads and writes them (the store, and this process's cache).

A record is immutable (a frozen dataclass), so a cached one can be handed to any request; a change
(a prepared record carried for the first time) is a new record saved over the old one. A record's
key is `sum:<scope>:<chain>`: the hash chain over the original envelopes it covers.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterable, Sequence

from proxy.compaction.record import RecordCache, SummaryRecord
from proxy.store.base import Store


def key(scope: str, chain_hex: str) -> str:
    return f"sum:{scope}:{chain_hex}"


def _read(raw: bytes | None) -> SummaryRecord | None:
    return SummaryRecord.from_bytes(raw) if raw is not None else None


class Records:
    def __init__(self, store: Store, clock: Callable[[], float]) -> None:
        self.store = store
        self.clock = clock
        self._cache = RecordCache()

    # -- this process's cache ------------------------------------------------------------------
    def has(self, k: str) -> bool:
        return k in self._cache

    def cached(self, k: str) -> SummaryRecord | None:
        """The record this process holds under `k`, expired or not."""
        return self._cache.get(k)

    def local(self, keys: Iterable[str]) -> SummaryRecord | None:
        """The first of `keys` (longest first; made lazily by the caller) this process holds unexpired."""
        for k in keys:
            rec = self._cache.get(k)
            if rec is None:
                continue
            if rec.expired(self.clock()):
                del self._cache[k]
                continue
            return rec
        return None

    def known(self) -> list[SummaryRecord]:
        """Every record this process holds (metrics, tests)."""
        return self._cache.values()

    # -- reads ---------------------------------------------------------------------------------
    async def get(self, k: str) -> SummaryRecord | None:
        """The record under `k`: cached, else the store's (not cached)."""
        return self._cache.get(k) or _read(await self.store.get(k))

    async def stored(self, keys: Sequence[str]) -> SummaryRecord | None:
        """The first of `keys` the store holds unexpired (then cached)."""
        if not keys:
            return None
        found = await self.store.get_many(list(keys))
        for k in keys:
            rec = _read(found.get(k))
            if rec is not None and not rec.expired(self.clock()):
                self._cache.put(k, rec)
                return rec
        return None

    async def first_of(self, keys: Sequence[str]) -> SummaryRecord | None:
        """The first of `keys` there is a record for, cached or stored (not cached, expired or not)."""
        found = next((self._cache[k] for k in keys if k in self._cache), None)
        if found is None and keys:
            stored = await self.store.get_many(list(keys))
            found = next((_read(stored[k]) for k in keys if k in stored), None)
        return found

    # -- writes --------------------------------------------------------------------------------
    async def save(self, scope: str, rec: SummaryRecord, ttl_s: float | None = None) -> None:
        """Store `rec` under its key, over whatever is there."""
        k = key(scope, rec.chain)
        if ttl_s is None:
            await self.store.put(k, rec.to_bytes())
        else:
            await self.store.put(k, rec.to_bytes(), ttl_s)
        self._cache.put(k, rec)

    async def publish(self, scope: str, rec: SummaryRecord) -> SummaryRecord:
        """Store a new record, unless another replica stored one for the same prefix first (a lock
        lost to a stalled process): then adopt theirs, so every replica forwards the same bytes."""
        k = key(scope, rec.chain)
        if not await self.store.add(k, rec.to_bytes()):
            rec = _read(await self.store.get(k)) or rec  # None: the store is down, and ours is all there is
        self._cache.put(k, rec)
        return rec

    async def carry(self, scope: str, rec: SummaryRecord, live_from: int) -> tuple[SummaryRecord, bool]:
        """A prepared record as carried by a request of `live_from` non-system messages, and True
        when no request (on any replica) carried it before, so the status says `summarized` once.
        Another replica may have carried it already: the stored copy tells (and when it went
        live), since our cached one still says prepared."""
        carried = replace(rec, prepared=False, live_from=live_from)
        k = key(scope, rec.chain)
        stored = _read(await self.store.get(k))
        if stored is not None and not stored.prepared:
            self._cache.put(k, stored)
            return stored, False
        await self.save(scope, carried)
        return carried, True
