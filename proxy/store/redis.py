"""Redis store: shared by several proxy replicas (summaries, the scope secret and locks).

Layout under the namespace `<ns>` (default "cp:"):
- `<ns>k:<key>` the value, with a native PEXPIRE of the key's TTL as a backstop;
- `<ns>lru`     ZSET of expiring keys scored by their last use, from the injectable clock;
- `<ns>ttl`     HASH of each expiring key's own TTL in milliseconds.
Expiry and LRU eviction are decided from the ZSET, so they follow the same clock as the other
backends (and tests need no sleeping); PEXPIRE only reclaims memory when nobody reads a key.
Permanent keys appear in neither ZSET nor HASH.
Originals (design.md § Recall) have a plain inverted index, no module needed: `<ns>ix:<prefix>i:<ident>`
and `<ns>ix:<prefix>w:<word>` are SETs of value keys (the prefix holds the scope, so a search
never sees another scope's sets), and `<ns>ixk:<key>` lists the SETs one original is in, so that
whatever drops the value (eviction, expiry by the clock, delete) drops its index entries in the
same script. A value Redis expired by itself leaves entries behind until a search meets them (it
prunes them) or its ZSET entry is evicted: bounded like the ZSET. Every operation is one Lua script, so each is
atomic across replicas. Bookkeeping left behind by a key that PEXPIRE removed is harmless: it is
the oldest entry in the ZSET, so the next eviction pops it first, and the ZSET stays bounded.
The ZSET, the HASH and the index SETs carry a PEXPIRE too, never shorter than that of a key they
track, so that bookkeeping nobody writes any more goes as well.
On a Redis Cluster (redis_cluster.py) `<ns>` is one hash-tagged namespace per group of keys, so
the same scripts touch one slot each.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from .base import Clock, Store, StoreUnavailable, value_words

_CHUNK = 500  # keys per script call, so that one read never blocks Redis for long

# Lua helpers shared by the scripts. KEYS[1] is the ZSET, KEYS[2] the HASH, then value keys.
_LIB = """
local lru, ttls = KEYS[1], KEYS[2]
local ns = string.sub(lru, 1, #lru - 3)
-- An original's index entries go with it (no-op for other keys: their list does not exist).
local function unindex(k)
  local ik = ns .. 'ixk:' .. string.sub(k, #ns + 3)
  local sets = redis.call('SMEMBERS', ik)
  for i = 1, #sets do redis.call('SREM', sets[i], k) end
  if #sets > 0 then redis.call('DEL', ik) end
end
-- Bookkeeping outlives what it tracks, and no longer: on a cluster every group has its own, and
-- groups come and go (a conversation ends); PTTL -1 (none yet) or shorter than ms gets ms.
local function outlive(k, ms)
  if redis.call('PTTL', k) < tonumber(ms) then redis.call('PEXPIRE', k, ms) end
end
local function drop(k)
  redis.call('DEL', k); redis.call('ZREM', lru, k); redis.call('HDEL', ttls, k); unindex(k)
end
-- The value, or false when absent or unused for longer than its TTL (then it is dropped).
local function live(k, now)
  local v = redis.call('GET', k)
  if not v then return false end
  local ttl = redis.call('HGET', ttls, k)
  local used = redis.call('ZSCORE', lru, k)
  if ttl and used and (now - tonumber(used)) * 1000 >= tonumber(ttl) then
    drop(k)
    return false
  end
  return v
end
-- Store ARGV[1] under k with TTL ARGV[3] ms ('' = permanent), only if absent when nx; then
-- evict the least recently used expiring keys past ARGV[4]. 1 when stored.
local function store(k, now, nx)
  local v, ttl, max = ARGV[1], ARGV[3], tonumber(ARGV[4])
  local set = {'SET', k, v}
  if ttl ~= '' then set[#set + 1] = 'PX'; set[#set + 1] = ttl end
  if nx then set[#set + 1] = 'NX' end
  if not redis.call(unpack(set)) then return 0 end
  if ttl == '' then
    redis.call('ZREM', lru, k); redis.call('HDEL', ttls, k)
    return 1
  end
  redis.call('ZADD', lru, now, k); redis.call('HSET', ttls, k, ttl)
  outlive(lru, ttl); outlive(ttls, ttl)
  local over = redis.call('ZCARD', lru) - max
  if over > 0 then
    local popped = redis.call('ZPOPMIN', lru, over)
    for i = 1, #popped, 2 do
      redis.call('DEL', popped[i]); redis.call('HDEL', ttls, popped[i]); unindex(popped[i])
    end
  end
  return 1
end
"""

# ARGV: now. Returns one value (or nil) per value key, refreshing the live expiring ones.
_GET_MANY = _LIB + """
local now = tonumber(ARGV[1])
local out = {}
for i = 3, #KEYS do
  local k = KEYS[i]
  local v = live(k, now)
  local ttl = v and redis.call('HGET', ttls, k)
  if ttl then
    redis.call('ZADD', lru, now, k); redis.call('PEXPIRE', k, ttl)
    outlive(lru, ttl); outlive(ttls, ttl)
    local ik = ns .. 'ixk:' .. string.sub(k, #ns + 3)  -- an original's index lives as long
    local sets = redis.call('SMEMBERS', ik)
    if #sets > 0 then outlive(ik, ttl) end
    for j = 1, #sets do outlive(sets[j], ttl) end
  end
  out[#out + 1] = v
end
return out
"""

# ARGV: now. The value (or nil), refreshing nothing.
_PEEK = _LIB + "return live(KEYS[3], tonumber(ARGV[1]))"

# ARGV: value, now, ttl ms or '', max_records.
_PUT = _LIB + "return store(KEYS[3], tonumber(ARGV[2]), false)"

# Same ARGV as put. A value that is stale by the clock is dropped first; then SET NX PX.
_ADD = _LIB + """
local now = tonumber(ARGV[2])
if live(KEYS[3], now) then return 0 end
return store(KEYS[3], now, true)
"""

# ARGV: now, '1' when an expected value is given, the expected value.
_DELETE = _LIB + """
local v = live(KEYS[3], tonumber(ARGV[1]))
if not v or (ARGV[2] == '1' and v ~= ARGV[3]) then return 0 end
drop(KEYS[3])
return 1
"""

# ARGV: value, now, ttl ms, max_records, then the index SETs the original goes in.
_PUT_ORIGINAL = _LIB + """
local k = KEYS[3]
unindex(k)
local stored = store(k, tonumber(ARGV[2]), false)
local ik = ns .. 'ixk:' .. string.sub(k, #ns + 3)
for i = 5, #ARGV do
  redis.call('SADD', ARGV[i], k); redis.call('SADD', ik, ARGV[i]); outlive(ARGV[i], ARGV[3])
end
if #ARGV >= 5 then outlive(ik, ARGV[3]) end
return stored
"""

# ARGV: now, limit, n, then n identifier SETs, then word SETs. Live value keys, best first:
# identifier matches weigh more than any number of words; ties go to the most recently used.
_FIND_ORIGINALS = _LIB + """
local now, limit, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local score, seen = {}, {}
for i = 4, #ARGV do
  local weight = (i < 4 + n) and 1000 or 1
  local members = redis.call('SMEMBERS', ARGV[i])
  for j = 1, #members do
    local m = members[j]
    if not score[m] then score[m] = 0; seen[#seen + 1] = m end
    score[m] = score[m] + weight
  end
end
local out, used = {}, {}
for i = 1, #seen do
  local k = seen[i]
  if live(k, now) then
    out[#out + 1] = k; used[k] = tonumber(redis.call('ZSCORE', lru, k) or 0)
  else
    drop(k)  -- expired by Redis itself, or by the clock: prune what led here
  end
end
table.sort(out, function(a, b)
  if score[a] ~= score[b] then return score[a] > score[b] end
  return used[a] > used[b]
end)
local top = {}
for i = 1, math.min(limit, #out) do top[i] = out[i] end
return top
"""

# Logs: `<ns>log:<name>` is a LIST of "<time> <value>" entries, newest last. ARGV: entry, max_len,
# ttl ms (the list's own PEXPIRE: a log nobody appends to for a TTL is gone whole).
_APPEND = """
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], -tonumber(ARGV[2]), -1)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""


class RedisStore(Store):
    errors: tuple[type[BaseException], ...] = (RedisError, OSError)  # what counts as "unavailable"

    def __init__(
        self,
        url: str,
        *,
        ttl_s: float,
        max_records: int,
        clock: Clock = time.time,
        namespace: str = "cp:",
    ) -> None:
        super().__init__(ttl_s=ttl_s, max_records=max_records, clock=clock)
        self._redis = self._connect(url)
        self._ns = namespace
        self._get_many = self._redis.register_script(_GET_MANY)
        self._peek = self._redis.register_script(_PEEK)
        self._put = self._redis.register_script(_PUT)
        self._add = self._redis.register_script(_ADD)
        self._delete = self._redis.register_script(_DELETE)
        self._append = self._redis.register_script(_APPEND)
        self._put_original = self._redis.register_script(_PUT_ORIGINAL)
        self._find_originals = self._redis.register_script(_FIND_ORIGINALS)

    def _connect(self, url: str) -> Any:
        # Short timeouts: a down Redis must cost a request milliseconds, not seconds; the caller
        # carries on without reuse. One immediate retry on a connection error only: after Redis
        # restarts, every pooled connection is dead, and each would otherwise fail one call (and
        # start an outage) before it is replaced. A timeout is never retried: it would double.
        return aioredis.Redis.from_url(
            url,
            socket_connect_timeout=1.0,
            socket_timeout=2.0,
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        )

    def _space(self, key: str) -> str:
        """The namespace holding `key` and its bookkeeping: one for all keys on one Redis (a
        cluster's store gives each group of keys its own, see redis_cluster.py)."""
        return self._ns

    def _key(self, key: str) -> str:
        return f"{self._space(key)}k:{key}"

    async def _call(self, script: Any, space: str, keys: list[str], args: list[Any]) -> Any:
        try:
            return await script(keys=[f"{space}lru", f"{space}ttl", *keys], args=args)
        except self.errors as e:
            raise StoreUnavailable(f"redis: {type(e).__name__}: {e}") from e

    async def _call_one(self, script: Any, key: str, args: list[Any]) -> Any:
        return await self._call(script, self._space(key), [self._key(key)], args)

    def _ttl_ms(self, ttl_s: float | None) -> str:
        ttl = self._ttl(ttl_s)
        return "" if ttl is None else str(max(1, round(ttl * 1000)))

    async def get_many(self, keys: list[str]) -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        now = repr(self.clock())
        spaces: dict[str, list[str]] = {}
        for k in keys:  # one script per namespace: a script touches one (a cluster slot) only
            spaces.setdefault(self._space(k), []).append(k)
        for space, group in spaces.items():
            for i in range(0, len(group), _CHUNK):
                chunk = group[i : i + _CHUNK]
                values = await self._call(self._get_many, space, [self._key(k) for k in chunk], [now])
                found.update((k, v) for k, v in zip(chunk, values) if v is not None)
        return found

    async def peek(self, key: str) -> bytes | None:
        return await self._call_one(self._peek, key, [repr(self.clock())])

    async def put(self, key: str, value: bytes, ttl_s: float | None = ...) -> None:  # type: ignore[assignment]
        args = [value, repr(self.clock()), self._ttl_ms(ttl_s), self.max_records]
        await self._call_one(self._put, key, args)

    async def add(self, key: str, value: bytes, ttl_s: float | None = ...) -> bool:  # type: ignore[assignment]
        args = [value, repr(self.clock()), self._ttl_ms(ttl_s), self.max_records]
        return bool(await self._call_one(self._add, key, args))

    async def delete(self, key: str, expected: bytes | None = None) -> bool:
        args = [repr(self.clock()), "0" if expected is None else "1", expected or b""]
        return bool(await self._call_one(self._delete, key, args))

    def _index_key(self, prefix: str, kind: str, term: str) -> str:
        return f"{self._space(prefix)}ix:{prefix}{kind}:{term}"

    async def put_original(self, key: str, value: bytes, identifiers: Sequence[str],
                           words: Sequence[str] | None = None) -> None:
        if not key.startswith("orig:"):
            raise ValueError("an original's key starts with 'orig:'")
        prefix = key[: key.rfind(":") + 1]  # orig:<scope>: the index is per scope
        sets = [self._index_key(prefix, "i", i) for i in dict.fromkeys(identifiers)]
        sets += [self._index_key(prefix, "w", w) for w in (await value_words(value) if words is None else words)]
        args = [value, repr(self.clock()), self._ttl_ms(...), self.max_records, *sets]
        await self._call_one(self._put_original, key, args)

    async def find_originals(
        self, prefix: str, words: Sequence[str], identifiers: Sequence[str], limit: int
    ) -> list[str]:
        if not prefix or limit <= 0 or not (words or identifiers):
            return []
        idents = [self._index_key(prefix, "i", i) for i in dict.fromkeys(identifiers)]
        sets = idents + [self._index_key(prefix, "w", w) for w in dict.fromkeys(words)]
        args = [repr(self.clock()), limit, len(idents), *sets]
        found = await self._call(self._find_originals, self._space(prefix), [], args)
        strip = len(self._key(prefix)) - len(prefix)
        return [k.decode()[strip:] for k in found]

    async def append(self, name: str, value: bytes, max_len: int) -> None:
        entry = repr(self.clock()).encode() + b" " + value
        try:
            await self._append(keys=[self._log_key(name)], args=[entry, max_len, max(1, round(self.ttl_s * 1000))])
        except self.errors as e:
            raise StoreUnavailable(f"redis: {type(e).__name__}: {e}") from e

    async def tail(self, name: str, n: int) -> list[tuple[float, bytes]]:
        if n <= 0:
            return []
        try:
            raw = await self._redis.lrange(self._log_key(name), -n, -1)
        except self.errors as e:
            raise StoreUnavailable(f"redis: {type(e).__name__}: {e}") from e
        since = self.clock() - self.ttl_s
        out = []
        for entry in raw:
            at, _, value = entry.partition(b" ")
            if float(at) > since:
                out.append((float(at), value))
        return out

    def _log_key(self, name: str) -> str:
        return f"{self._ns}log:{name}"

    async def ping(self) -> None:
        try:
            await self._redis.ping()
        except self.errors as e:
            raise StoreUnavailable(f"redis: {type(e).__name__}: {e}") from e

    async def close(self) -> None:
        await self._redis.aclose()
