"""SingleFlight (proxy/singleflight.py): one call per key within a process and across replicas.

Replicas are SingleFlight instances over one shared store: a memory store with a fake clock where
expiry matters (no sleeping), two clients of a real redis-server where sharing matters.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from proxy.singleflight import SingleFlight
from proxy.store.base import StoreUnavailable
from proxy.store.memory import MemoryStore
from proxy.store.redis import RedisStore
from proxy.store.redis_cluster import RedisClusterStore
from proxy.store.resilient import ResilientStore
from proxy.store.sqlite import SqliteStore
from support.clock import FakeClock
from support.redis_cluster import RedisCluster, redis_cluster  # noqa: F401
from support.redis_server import RedisServer

LOCK_TTL = 10.0


class Maker:
    """A `make` that counts its calls and finishes when released."""

    def __init__(self, value: str = "value", *, error: Exception | None = None) -> None:
        self.value = value
        self.error = error
        self.calls = 0
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self) -> str:
        self.calls += 1
        self.started.set()
        await self.release.wait()
        if self.error is not None:
            raise self.error
        return self.value


class Records:
    """`existing` reading the records a `make` stored (the caller's side of the protocol)."""

    def __init__(self, store: MemoryStore | RedisStore | ResilientStore, key: str) -> None:
        self.store = store
        self.key = key

    async def existing(self) -> str | None:
        raw = await self.store.get(self.key)
        return raw.decode() if raw is not None else None

    def storing(self, maker: Maker):  # noqa: ANN201
        async def make() -> str:
            value = await maker()
            await self.store.put(self.key, value.encode())
            return value

        return make


async def _nothing() -> None:
    return None


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> MemoryStore:
    return MemoryStore(ttl_s=3600, max_records=100, clock=clock)


# -- within one process -------------------------------------------------------------------------


async def test_concurrent_callers_share_one_call(store: MemoryStore) -> None:
    flight: SingleFlight[str] = SingleFlight(store, lock_ttl_s=LOCK_TTL, poll_s=0.01)
    maker = Maker()
    callers = [asyncio.create_task(flight.run("k", maker, _nothing)) for _ in range(10)]
    await maker.started.wait()
    assert flight.running("k") and flight.in_flight == 1
    maker.release.set()
    assert await asyncio.gather(*callers) == ["value"] * 10
    assert maker.calls == 1
    assert flight.in_flight == 0
    assert await store.get("lock:k") is None  # released


async def test_a_leader_failure_reaches_every_waiter(store: MemoryStore) -> None:
    flight: SingleFlight[str] = SingleFlight(store, lock_ttl_s=LOCK_TTL, poll_s=0.01)
    maker = Maker(error=RuntimeError("summarizer down"))
    callers = [asyncio.create_task(flight.run("k", maker, _nothing)) for _ in range(5)]
    await maker.started.wait()
    maker.release.set()
    results = await asyncio.gather(*callers, return_exceptions=True)
    assert [str(r) for r in results] == ["summarizer down"] * 5
    assert all(isinstance(r, RuntimeError) for r in results)
    assert maker.calls == 1
    assert await store.get("lock:k") is None  # a failed leader releases its lock
    # the next caller starts afresh
    again = Maker("second")
    again.release.set()
    assert await flight.run("k", again, _nothing) == "second"


async def test_a_cancelled_waiter_leaves_the_call_running(store: MemoryStore) -> None:
    flight: SingleFlight[str] = SingleFlight(store, lock_ttl_s=LOCK_TTL, poll_s=0.01)
    maker = Maker()
    first = asyncio.create_task(flight.run("k", maker, _nothing))
    second = asyncio.create_task(flight.run("k", maker, _nothing))
    await maker.started.wait()
    first.cancel()  # its client went away
    with pytest.raises(asyncio.CancelledError):
        await first
    maker.release.set()
    assert await second == "value"
    assert maker.calls == 1


async def test_an_existing_value_makes_nothing(store: MemoryStore) -> None:
    flight: SingleFlight[str] = SingleFlight(store, lock_ttl_s=LOCK_TTL, poll_s=0.01)
    records = Records(store, "rec")
    await store.put("rec", b"stored")
    maker = Maker()
    assert await flight.run("k", maker, records.existing) == "stored"
    assert maker.calls == 0


async def test_cancel_all_stops_the_calls(store: MemoryStore) -> None:
    flight: SingleFlight[str] = SingleFlight(store, lock_ttl_s=LOCK_TTL, poll_s=0.01)
    maker = Maker()
    caller = asyncio.create_task(flight.run("k", maker, _nothing))
    await maker.started.wait()
    await flight.cancel_all()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert flight.in_flight == 0
    assert await store.get("lock:k") is None


# -- across replicas ----------------------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.parametrize("kind", ["redis", "redis-cluster"])
async def test_replicas_sharing_redis_make_one_call(kind: str, request: pytest.FixtureRequest) -> None:
    namespace = f"sf-{uuid.uuid4().hex}:"
    server: RedisServer | RedisCluster = request.getfixturevalue("redis_cluster" if kind == "redis-cluster" else "redis_server")
    make = RedisClusterStore if kind == "redis-cluster" else RedisStore
    stores = [make(server.url, ttl_s=3600, max_records=100, namespace=namespace) for _ in range(2)]
    try:
        flights: list[SingleFlight[str]] = [SingleFlight(s, lock_ttl_s=LOCK_TTL, poll_s=0.01) for s in stores]
        records = [Records(s, "rec") for s in stores]
        maker = Maker()
        callers = [
            asyncio.create_task(flights[i % 2].run("k", records[i % 2].storing(maker), records[i % 2].existing))
            for i in range(10)
        ]
        await maker.started.wait()
        await asyncio.sleep(0.1)  # both replicas are in: one works, the other polls
        maker.release.set()
        assert await asyncio.wait_for(asyncio.gather(*callers), 10) == ["value"] * 10
        assert maker.calls == 1
    finally:
        for s in stores:
            await s.close()


async def test_a_dead_lock_holder_is_replaced_after_the_lock_expires(store: MemoryStore, clock: FakeClock) -> None:
    # A replica took the lock and died: nobody releases or refreshes it.
    assert await store.add("lock:k", b"dead replica", LOCK_TTL)
    flight: SingleFlight[str] = SingleFlight(store, lock_ttl_s=LOCK_TTL, poll_s=0.01)
    records = Records(store, "rec")
    maker = Maker()
    maker.release.set()
    caller = asyncio.create_task(flight.run("k", records.storing(maker), records.existing))
    await asyncio.sleep(0.1)
    assert not caller.done() and maker.calls == 0  # waiting for the holder
    clock.advance(LOCK_TTL)
    assert await asyncio.wait_for(caller, 5) == "value"
    assert maker.calls == 1
    assert await store.get("rec") == b"value"


async def test_a_live_holder_keeps_its_lock_past_the_expiry(store: MemoryStore, clock: FakeClock) -> None:
    """The holder's beats rewrite its lock while it works, so another replica does not take over.
    Only the beats may keep it: the other replica's looks at the lock are peeks, which refresh
    nothing, and it looks once (its own beat, and so its look, is an hour: the fake clock jumps
    past the holder's missed-beat bound between beats)."""
    lock_ttl = 0.3  # expiry follows the fake clock, moved 0.25 s after each beat
    refreshed = asyncio.Event()

    class Watched(MemoryStore):
        async def put(self, key: str, value: bytes, ttl_s: float | None = ...) -> None:  # type: ignore[assignment]
            await super().put(key, value, ttl_s)
            if key.startswith("lock:"):
                refreshed.set()  # a beat

    shared = Watched(ttl_s=3600, max_records=100, clock=clock)
    holder: SingleFlight[str] = SingleFlight(shared, lock_ttl_s=lock_ttl, heartbeat_s=0.05, poll_s=0.01)
    other: SingleFlight[str] = SingleFlight(shared, lock_ttl_s=lock_ttl, heartbeat_s=3600, poll_s=0.01)
    records = Records(shared, "rec")
    slow, second = Maker("holder's"), Maker("other's")
    first = asyncio.create_task(holder.run("k", records.storing(slow), records.existing))
    await slow.started.wait()
    waiter = asyncio.create_task(other.run("k", records.storing(second), records.existing))
    try:
        for _ in range(5):  # 5 x 0.25 s of fake time: far past one lock_ttl, a beat each time
            refreshed.clear()
            await asyncio.wait_for(refreshed.wait(), 5)
            clock.advance(0.25)
            await asyncio.sleep(0.03)  # the other replica polls meanwhile
        assert second.calls == 0
    finally:
        slow.release.set()
        second.release.set()  # (when the lock was lost: the other's summary, so that both end)
    assert await asyncio.wait_for(asyncio.gather(first, waiter), 5) == ["holder's", "holder's"]
    assert second.calls == 0


async def test_polling_stops_when_the_store_goes_down(store: MemoryStore) -> None:
    """A replica waiting for another's lock makes the value itself once the store stops answering."""

    class Switchable(MemoryStore):
        down = False

        async def get_many(self, keys: list[str]) -> dict[str, bytes]:
            if self.down:
                raise StoreUnavailable("gone")
            return await super().get_many(keys)

        async def add(self, key: str, value: bytes, ttl_s: float | None = ...) -> bool:  # type: ignore[assignment]
            if self.down:
                raise StoreUnavailable("gone")
            return await super().add(key, value, ttl_s)

    inner = Switchable(ttl_s=3600, max_records=100)
    shared = ResilientStore(inner)
    assert await shared.add("lock:k", b"another replica", 3600)
    flight: SingleFlight[str] = SingleFlight(shared, lock_ttl_s=LOCK_TTL, poll_s=0.01)
    records = Records(shared, "rec")
    maker = Maker("made without the store")
    maker.release.set()
    caller = asyncio.create_task(flight.run("k", records.storing(maker), records.existing))
    await asyncio.sleep(0.1)
    assert not caller.done()  # the lock is honoured while the store answers
    inner.down = True
    assert await asyncio.wait_for(caller, 5) == "made without the store"
    assert maker.calls == 1


async def test_a_down_store_does_not_delay_the_call() -> None:
    class Down(MemoryStore):
        calls = 0

        async def get_many(self, keys: list[str]) -> dict[str, bytes]:
            self.calls += 1
            raise StoreUnavailable("gone")

        async def add(self, key: str, value: bytes, ttl_s: float | None = ...) -> bool:  # type: ignore[assignment]
            self.calls += 1
            raise StoreUnavailable("gone")

    shared = ResilientStore(Down(ttl_s=3600, max_records=100))
    flight: SingleFlight[str] = SingleFlight(shared, lock_ttl_s=LOCK_TTL, poll_s=10)
    records = Records(shared, "rec")
    maker = Maker()
    maker.release.set()
    # poll_s=10: a single poll would blow the 2 s bound
    assert await asyncio.wait_for(flight.run("k", records.storing(maker), records.existing), 2) == "value"
    assert maker.calls == 1


# -- owners, heartbeats, the wait bound (issue 19 item 3) -----------------------------------------

import os  # noqa: E402
import time  # noqa: E402

import orjson  # noqa: E402

from proxy.singleflight import OWNER, Busy, clear_dead_locks, left_by_a_dead_life  # noqa: E402


def foreign_lock(beat: float, every: float = 0.2, **owner: object) -> bytes:
    return orjson.dumps({"host": "another-host", "pid": 4242, "life": "x", "token": "t", "beat": beat, "every": every,
                         **owner})


async def test_a_lock_whose_holder_stopped_beating_is_taken_over_after_two_missed_beats():
    store = MemoryStore(ttl_s=3600, max_records=100)
    # Another replica took the lock and died: it beats no more (its expiry is far away).
    await store.put("lock:k", foreign_lock(time.time()), 3600)
    flight: SingleFlight[str] = SingleFlight(store, lock_ttl_s=3600, heartbeat_s=0.2, max_wait_s=30, poll_s=0.01)
    rec = Records(store, "k")
    maker = Maker("mine")
    maker.release.set()
    t0 = time.monotonic()
    assert await flight.run("k", rec.storing(maker), rec.existing) == "mine"
    waited = time.monotonic() - t0
    assert 2 * 0.2 <= waited < 3600 and maker.calls == 1, waited  # two missed beats, not the expiry
    assert await store.get("lock:k") is None  # released after use


async def test_a_live_holder_keeps_its_lock_and_a_waiter_gives_up_at_max_wait():
    store = MemoryStore(ttl_s=3600, max_records=100)
    holder: SingleFlight[str] = SingleFlight(store, lock_ttl_s=3600, heartbeat_s=0.1, poll_s=0.01)
    waiter: SingleFlight[str] = SingleFlight(store, lock_ttl_s=3600, heartbeat_s=0.1, max_wait_s=0.8, poll_s=0.01)
    rec = Records(store, "k")
    slow = Maker("holder's")
    held = asyncio.create_task(holder.run("k", rec.storing(slow), rec.existing))
    await slow.started.wait()
    never = Maker("never")
    never.release.set()  # were the lock taken over, the waiter's value would come back at once: a failure, not a hang
    t0 = time.monotonic()
    try:
        with pytest.raises(Busy):
            await asyncio.wait_for(waiter.run("k", rec.storing(never), rec.existing), 5)
    finally:
        slow.release.set()
    assert 0.8 <= time.monotonic() - t0 < 3  # beats kept the lock; the wait is bounded
    assert await held == "holder's" and never.calls == 0


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_a_lock_without_a_beat_expires_while_a_waiter_polls_it(backend: str, tmp_path) -> None:
    """A lock with no heartbeat in it (an older version's, or garbage) is freed only by its expiry.
    The waiter looks at it every half beat, and those looks must not refresh it: were they reads,
    the lock would live as long as anyone waited, and the waiter would give up at max_wait."""
    store = MemoryStore(ttl_s=3600, max_records=100) if backend == "memory" else \
        SqliteStore(str(tmp_path / "s.db"), ttl_s=3600, max_records=100)
    try:
        await store.put("lock:k", b"an older version's lock", 0.5)
        flight: SingleFlight[str] = SingleFlight(store, lock_ttl_s=3600, heartbeat_s=0.05, max_wait_s=3, poll_s=0.01)
        rec = Records(store, "k")
        maker = Maker("mine")
        maker.release.set()
        t0 = time.monotonic()
        assert await asyncio.wait_for(flight.run("k", rec.storing(maker), rec.existing), 10) == "mine"
        assert 0.4 <= time.monotonic() - t0 < 3 and maker.calls == 1  # the lock's expiry, not max_wait
    finally:
        await store.close()


async def test_a_second_request_in_the_process_waits_at_most_max_wait_for_the_first_ones_value():
    store = MemoryStore(ttl_s=3600, max_records=100)
    flight: SingleFlight[str] = SingleFlight(store, lock_ttl_s=3600, max_wait_s=0.3, poll_s=0.01)
    rec = Records(store, "k")
    slow = Maker("first")
    first = asyncio.create_task(flight.run("k", rec.storing(slow), rec.existing))
    await slow.started.wait()
    with pytest.raises(Busy):
        await flight.run("k", rec.storing(Maker()), rec.existing)
    with pytest.raises(Busy):
        await flight.join("k")
    slow.release.set()
    assert await first == "first" and slow.calls == 1


async def test_start_up_clears_only_locks_left_by_a_dead_life_of_this_process(tmp_path):
    from proxy.store.sqlite import SqliteStore

    store = SqliteStore(str(tmp_path / "s.db"), ttl_s=3600, max_records=100)
    here = {"host": OWNER["host"]}
    gone = {**here, "pid": _dead_pid(), "life": "old"}
    locks = {
        "lock:same-pid-earlier-life": foreign_lock(time.time(), **here, pid=OWNER["pid"], life="earlier"),
        "lock:dead-pid": foreign_lock(time.time(), **gone),
        "lock:live-process": foreign_lock(time.time(), **here, pid=os.getppid(), life="theirs"),
        "lock:other-host": foreign_lock(time.time(), pid=OWNER["pid"]),
        "lock:this-life": foreign_lock(time.time(), **OWNER),
        "lock:old-format": b"a0b1c2",
    }
    for k, v in locks.items():
        await store.put(k, v, 3600)
    await store.put("sum:record", b"kept", 3600)
    assert await clear_dead_locks(store) == 2
    left = await store.scan("lock:")
    assert sorted(left) == ["lock:live-process", "lock:old-format", "lock:other-host", "lock:this-life"]
    assert await store.get("sum:record") == b"kept"
    assert not left_by_a_dead_life(b"not json")
    await store.close()


def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid
