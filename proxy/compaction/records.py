"""Summary records: the only code that reads and writes them (the store, and this process's cache).

A record is immutable (a frozen dataclass), so a cached one can be handed to any request; a change
(a prepared record carried for the first time) is a new record saved over the old one. A record's
key is `sum:<scope>:<chain>`: the hash chain over the original envelopes it covers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Sequence

from proxy.compaction.record import RecordCache, SummaryRecord
from proxy.store.base import Store


def key(scope: str, chain_hex: str) -> str:
    return f"sum:{scope}:{chain_hex}"


LOOKED = "records.looked"  # a request's record lookup (Looked), in its __dict__
CARRIED = "records.carried"  # a request's carried record (Records.carried), in its __dict__


@dataclass(frozen=True)
class Looked:
    """What a request's lookup of this process's records saw: the cache's puts then, the scope,
    the longest prefix it tried (envelopes after the system part), the key it found (or None)."""

    puts: int
    scope: str
    top: int
    found: str | None


def _looked(request: Any) -> Looked | None:
    """The previous request's lookup when this request starts with all of its envelopes."""
    looked = request.before(LOOKED)
    return looked if looked is not None and request.shared >= looked.top + 1 + request.conversation.n_system else None


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
        found = self._first(keys)
        return found[1] if found is not None else None

    def _first(self, keys: Iterable[str]) -> tuple[str, SummaryRecord] | None:
        for k in keys:
            rec = self._cache.get(k)
            if rec is None:
                continue
            if rec.expired(self.clock()):
                del self._cache[k]
                continue
            return k, rec
        return None

    def local_for(self, view: Any) -> SummaryRecord | None:
        """`local` over the view's prefix keys. A request that grew from the previous one of its
        conversation, no record put since that one looked, tries its new prefixes' keys only, then
        the key that one found: every shorter key missed then and misses still (a record kept
        after a turn is found in one lookup, not in one a kept envelope)."""
        request = view.flow.request
        mine = view.keys is None and len(view.conv) == len(request.conversation)
        before = _looked(request) if mine else None
        if before is None or before.puts != self._cache.puts or before.scope != view.scope:
            found = self._first(view.lazy_keys())
        else:
            found = self._first(view.lazy_keys(longer_than=before.top))
            if found is None and before.found is not None:
                found = self._first((before.found,)) or self._first(view.lazy_keys())
        if mine:
            request.__dict__[LOOKED] = Looked(self._cache.puts, view.scope, len(view.conv) - view.n_system - 1,
                                              found[0] if found is not None else None)
        return found[1] if found is not None else None

    def carried_before(self, view: Any, prepared: SummaryRecord) -> SummaryRecord | None:
        """The record shorter than `prepared` the previous request of the conversation found in this
        process's cache (`first_of` the shorter prefixes' keys), when this request shares those
        prefixes, nothing was put since and the cache still holds it: the first of those keys in
        the cache then is the first now (a key comes into the cache only by a put)."""
        request = view.flow.request
        known = request.before(CARRIED)
        if known is None or view.keys is not None or len(view.conv) != len(request.conversation) \
                or request.shared < view.n_system + prepared.covered + 1:
            return None
        puts, scope, chain, current = known
        if puts != self._cache.puts or scope != view.scope or chain != prepared.chain \
                or self._cache.get(key(scope, current.chain)) is not current:
            return None
        return current

    def carried(self, view: Any, prepared: SummaryRecord, current: SummaryRecord | None) -> None:
        """Keep what `first_of` found shorter than `prepared` for the next request (carried_before)."""
        if current is not None and self._cache.get(key(view.scope, current.chain)) is current:
            view.flow.request.__dict__[CARRIED] = (self._cache.puts, view.scope, prepared.chain, current)

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
