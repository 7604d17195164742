"""The store contract (proxy/store/base.py), checked against every backend with one suite.

Time is a fake clock handed to the store, so expiry is tested without sleeping. Redis runs as a
real redis-server (tests/support/redis_server.py); each test gets its own key namespace.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from proxy.prompts import Prompts
from proxy.recall.originals import Original, Originals
from proxy.recall.tool import answer as tool_answer
from proxy.store import Store, StoreUnavailable, open_store
from proxy.store.base import OriginalRow
from proxy.store.memory import MemoryStore
from proxy.store.redis import RedisStore
from proxy.store.redis_cluster import RedisClusterStore
from proxy.store.resilient import ResilientStore
from proxy.store.sqlite import SqliteStore
from support.clock import FakeClock
from support.redis_cluster import RedisCluster, redis_cluster  # noqa: F401
from support.redis_server import RedisServer, redis_server, redis_server_fixture  # noqa: F401

TTL = 100.0

# A server of its own for the tests that stop it, so the shared one is never disturbed.
private_redis = redis_server_fixture("private_redis")


MakeStore = Callable[..., Store]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis),
                        pytest.param("redis-cluster", marks=pytest.mark.redis)])
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
async def make_store(
    request: pytest.FixtureRequest, backend: str, tmp_path: Path, clock: FakeClock
) -> AsyncIterator[MakeStore]:
    """Builds stores of the parametrized backend; closes them after the test.

    SQLite and Redis stores made in one test share their data (one file, one namespace), like
    replicas sharing a store; memory stores never do.
    """
    server: RedisServer | None = request.getfixturevalue("redis_server") if backend == "redis" else None
    cluster: RedisCluster | None = request.getfixturevalue("redis_cluster") if backend == "redis-cluster" else None
    namespace = f"test-{uuid.uuid4().hex}:"
    stores: list[Store] = []

    def make(*, ttl_s: float = TTL, max_records: int = 1000) -> Store:
        store: Store
        if backend == "memory":
            store = MemoryStore(ttl_s=ttl_s, max_records=max_records, clock=clock)
        elif backend == "sqlite":
            store = SqliteStore(str(tmp_path / "store.db"), ttl_s=ttl_s, max_records=max_records, clock=clock)
        elif cluster is not None:
            store = RedisClusterStore(
                cluster.url, ttl_s=ttl_s, max_records=max_records, clock=clock, namespace=namespace
            )
        else:
            assert server is not None
            store = RedisStore(
                server.url, ttl_s=ttl_s, max_records=max_records, clock=clock, namespace=namespace
            )
        stores.append(store)
        return store

    yield make
    for store in stores:
        await store.close()


@pytest.fixture
def store(make_store: MakeStore) -> Store:
    return make_store()


# -- basic reads and writes -------------------------------------------------------------------


async def test_put_get_and_missing_keys(store: Store) -> None:
    assert await store.get("a") is None
    assert await store.get_many([]) == {}
    await store.put("a", b"1")
    await store.put("b", b"2")
    assert await store.get("a") == b"1"
    assert await store.get_many(["a", "missing", "b", "a"]) == {"a": b"1", "b": b"2"}


async def test_overwrite(store: Store) -> None:
    await store.put("a", b"old")
    await store.put("a", b"new")
    assert await store.get("a") == b"new"


async def test_get_many_beyond_one_chunk(make_store: MakeStore) -> None:
    store = make_store(max_records=2000)
    keys = [f"key-{i}" for i in range(1100)]
    for i, key in enumerate(keys):
        await store.put(key, str(i).encode())
    found = await store.get_many(keys + ["missing"])
    assert found == {key: str(i).encode() for i, key in enumerate(keys)}


async def test_values_round_trip_exactly(store: Store) -> None:
    values = {
        "empty": b"",
        "binary": bytes(range(256)),
        "not-utf8": b"\xff\xfe\x00\xc3(\x80 caf\xe9",
        "big": os.urandom(1024 * 1024),
    }
    for key, value in values.items():
        await store.put(key, value)
    assert await store.get_many(list(values)) == values


# -- add and delete ---------------------------------------------------------------------------


async def test_add_is_set_if_absent(store: Store, clock: FakeClock) -> None:
    assert await store.add("lock", b"me", ttl_s=10) is True
    assert await store.add("lock", b"you", ttl_s=10) is False
    assert await store.get("lock") == b"me"
    clock.advance(11)
    assert await store.add("lock", b"you", ttl_s=10) is True  # the holder's lock expired
    assert await store.get("lock") == b"you"


async def test_add_refuses_over_a_permanent_key(store: Store, clock: FakeClock) -> None:
    assert await store.add("secret", b"s1", ttl_s=None) is True
    clock.advance(10 * TTL)
    assert await store.add("secret", b"s2", ttl_s=None) is False
    assert await store.get("secret") == b"s1"


async def test_concurrent_adds_have_one_winner(store: Store) -> None:
    results = await asyncio.gather(*(store.add("lock", str(i).encode(), ttl_s=10) for i in range(20)))
    assert results.count(True) == 1
    assert await store.get("lock") == str(results.index(True)).encode()


async def test_delete(store: Store) -> None:
    await store.put("a", b"1")
    assert await store.delete("a") is True
    assert await store.get("a") is None
    assert await store.delete("a") is False
    assert await store.delete("never") is False


async def test_delete_with_expected_value(store: Store) -> None:
    await store.put("lock", b"mine")
    assert await store.delete("lock", expected=b"theirs") is False
    assert await store.get("lock") == b"mine"
    assert await store.delete("lock", expected=b"mine") is True
    assert await store.get("lock") is None
    assert await store.delete("lock", expected=b"mine") is False


async def test_delete_of_expired_key_deletes_nothing(store: Store, clock: FakeClock) -> None:
    await store.put("lock", b"mine", ttl_s=10)
    clock.advance(11)
    assert await store.delete("lock", expected=b"mine") is False
    assert await store.add("lock", b"next", ttl_s=10) is True


# -- expiry -----------------------------------------------------------------------------------


async def test_keys_expire_after_ttl(store: Store, clock: FakeClock) -> None:
    await store.put("a", b"1")
    await store.put("b", b"2")
    clock.advance(TTL * 0.5)
    assert await store.get("a") == b"1"
    clock.advance(TTL * 0.6)  # b unused for 1.1 x TTL, a for 0.6 x TTL
    assert await store.get_many(["a", "b"]) == {"a": b"1"}


async def test_read_refreshes_ttl(store: Store, clock: FakeClock) -> None:
    await store.put("a", b"1")
    clock.advance(TTL * 0.9)
    assert await store.get("a") == b"1"
    clock.advance(TTL * 0.6)  # 1.5 x TTL after the write, 0.6 x TTL after the read
    assert await store.get_many(["a"]) == {"a": b"1"}
    clock.advance(TTL * 1.01)
    assert await store.get("a") is None


async def test_peek_reads_without_refreshing(store: Store, clock: FakeClock) -> None:
    await store.put("a", b"1")
    await store.put("p", b"2", ttl_s=None)
    assert await store.peek("missing") is None
    clock.advance(TTL * 0.9)
    assert await store.peek("a") == b"1"
    clock.advance(TTL * 0.2)  # 1.1 x TTL after the write: the peek was no use
    assert await store.peek("a") is None
    assert await store.get("a") is None
    assert await store.peek("p") == b"2"  # permanent


async def test_a_key_keeps_its_own_ttl_across_refreshes(store: Store, clock: FakeClock) -> None:
    await store.put("lock", b"1", ttl_s=10)
    clock.advance(5)
    assert await store.get("lock") == b"1"
    clock.advance(9)
    assert await store.get("lock") == b"1"
    clock.advance(11)  # refreshed by its own 10 s, not the store's TTL
    assert await store.get("lock") is None


async def test_permanent_keys_never_expire(store: Store, clock: FakeClock) -> None:
    await store.put("secret", b"s", ttl_s=None)
    clock.advance(1000 * TTL)
    assert await store.get("secret") == b"s"


async def test_switching_between_permanent_and_expiring(store: Store, clock: FakeClock) -> None:
    await store.put("a", b"1")
    await store.put("a", b"2", ttl_s=None)
    clock.advance(10 * TTL)
    assert await store.get("a") == b"2"
    await store.put("a", b"3")
    clock.advance(10 * TTL)
    assert await store.get("a") is None


# -- bound ------------------------------------------------------------------------------------


async def test_max_records_evicts_least_recently_used(make_store: MakeStore, clock: FakeClock) -> None:
    store = make_store(max_records=3)
    await store.put("secret", b"s", ttl_s=None)  # permanent: neither counted nor evicted
    for key in ("a", "b", "c"):
        await store.put(key, key.encode())
        clock.advance(1)
    assert await store.get("a") == b"a"  # a is now the most recently used
    clock.advance(1)
    await store.put("d", b"d")
    assert await store.get_many(["a", "b", "c", "d", "secret"]) == {
        "a": b"a", "c": b"c", "d": b"d", "secret": b"s",
    }
    for key in ("d", "c"):  # now a is the least recently used
        clock.advance(1)
        assert await store.get(key) is not None
    clock.advance(1)
    assert await store.add("e", b"e") is True  # add is a write that counts too
    assert await store.get_many(["a", "c", "d", "e", "secret"]) == {
        "c": b"c", "d": b"d", "e": b"e", "secret": b"s",
    }


async def test_the_bound_holds_under_many_writes(make_store: MakeStore, clock: FakeClock) -> None:
    store = make_store(max_records=10)
    for i in range(100):
        await store.put(f"k{i}", b"v")
        clock.advance(1)
    assert await store.put("k99", b"overwritten") is None  # an overwrite adds no record
    keys = [f"k{i}" for i in range(100)]
    assert sorted(await store.get_many(keys)) == sorted(f"k{i}" for i in range(90, 100))


async def test_expired_records_make_room_without_evicting_live_ones(make_store: MakeStore, clock: FakeClock) -> None:
    store = make_store(max_records=2)
    await store.put("old", b"1")
    clock.advance(TTL + 1)
    await store.put("a", b"a")
    clock.advance(1)
    await store.put("b", b"b")  # "old" is expired: it goes first, never a live record
    assert await store.get_many(["old", "a", "b"]) == {"a": b"a", "b": b"b"}


# -- replicas sharing one store -----------------------------------------------------------------


async def test_replicas_share_records_locks_expiry_and_the_bound(
    backend: str, make_store: MakeStore, clock: FakeClock
) -> None:
    if backend == "memory":
        pytest.skip("memory:// is private to one process")
    a, b = make_store(max_records=3), make_store(max_records=3)
    await a.put("x", b"1")
    assert await b.get("x") == b"1"
    assert await a.add("lock", b"a", ttl_s=10) is True
    assert await b.add("lock", b"b", ttl_s=10) is False  # one lock across replicas
    assert await b.delete("lock", expected=b"b") is False
    clock.advance(1)
    await b.put("y", b"2")
    clock.advance(1)
    assert await a.get("x") == b"1"  # a read on one replica refreshes the record for all
    clock.advance(1)
    await b.put("z", b"3")  # four expiring keys, bound 3: the least recently used (the lock) goes
    assert await a.get("lock") is None
    clock.advance(TTL - 0.5)  # y and x were last used 2 s and 1 s before z
    assert await b.get_many(["x", "y", "z"]) == {"z": b"3"}


# -- originals (recall, design.md § Recall) -------------------------------------------------------------

ORIG_A = "orig:scopea:"
ORIG_B = "orig:scopeb:"


async def test_originals_are_found_by_identifier_and_by_words(store: Store) -> None:
    await store.put_original(ORIG_A + "h1", b"Traceback: ValueError: bad checksum in block 3391",
                             ["3391", "ValueError: bad checksum in block 3391"])
    await store.put_original(ORIG_A + "h2", "the deploy of commit 3f9a2c1e went to staging; caf\u00e9".encode(),
                             ["3f9a2c1e"])
    assert await store.get(ORIG_A + "h1") == b"Traceback: ValueError: bad checksum in block 3391"
    assert await store.find_originals(ORIG_A, [], ["3f9a2c1e"], 10) == [ORIG_A + "h2"]
    assert await store.find_originals(ORIG_A, ["checksum"], [], 10) == [ORIG_A + "h1"]
    assert await store.find_originals(ORIG_A, ["staging", "nothing"], [], 10) == [ORIG_A + "h2"]
    assert await store.find_originals(ORIG_A, ["absent"], ["3f9a2c"], 10) == []  # identifiers match exactly
    # an identifier match comes before any number of words
    assert await store.find_originals(ORIG_A, ["bad", "checksum", "block"], ["3f9a2c1e"], 10) == [
        ORIG_A + "h2", ORIG_A + "h1"]
    assert await store.find_originals(ORIG_A, ["bad", "checksum", "block"], ["3f9a2c1e"], 1) == [ORIG_A + "h2"]


async def test_originals_written_together_are_stored_and_found_as_one_by_one(store: Store) -> None:
    """put_originals (a masking's originals at once) stores and indexes each row as put_original
    does, a row rewritten among them included."""
    await store.put_original(ORIG_A + "h0", b"stale text of h0", ["old-id-1x"])
    await store.put_originals([OriginalRow(ORIG_A + "h0", b"fresh text of h0", ["new-id-1x"]),
                               OriginalRow(ORIG_A + "h1", b"the deploy of commit 3f9a2c1e", ["3f9a2c1e"],
                                           ["the", "deploy", "of", "commit", "3f9a2c1e"])])
    await store.put_originals([])
    assert await store.get_many([ORIG_A + "h0", ORIG_A + "h1"]) == {
        ORIG_A + "h0": b"fresh text of h0", ORIG_A + "h1": b"the deploy of commit 3f9a2c1e"}
    assert await store.find_originals(ORIG_A, [], ["3f9a2c1e"], 10) == [ORIG_A + "h1"]
    assert await store.find_originals(ORIG_A, ["deploy"], [], 10) == [ORIG_A + "h1"]
    assert await store.find_originals(ORIG_A, ["fresh"], ["new-id-1x"], 10) == [ORIG_A + "h0"]
    assert await store.find_originals(ORIG_A, ["stale"], ["old-id-1x"], 10) == []


async def test_an_identifier_query_finds_its_original_not_the_ones_sharing_its_words(store: Store) -> None:
    """Searching a key like seg_1a2b3c finds the original that carries it, not every text with the
    word "seg" in it (the words of an identifier are indexed as words too); words still find what
    no identifier names, and an identifier nobody carries falls back to its words."""
    originals = Originals(store)
    fact = Original("aaaaaaaaaaaa", "tool output", "run_tests()",
                    "line 1 ok\nValueError: checksum mismatch in segment seg_1a2b3c (expected 0x12ab, got 0x99ff)\n"
                    "line 3: seg 7 of the upload ok")
    noise = [Original(f"bbbbbbbbbb{i:02d}", "tool output", "read_file()", f"seg {i} of the upload: 1a2b3c seg ok")
             for i in range(6)]
    for o in [*noise, fact]:
        await originals.save("s1", o)
    assert [o.handle for o in await originals.search("s1", "seg_1a2b3c")] == ["aaaaaaaaaaaa"]
    assert {o.handle for o in await originals.search("s1", "upload")} == {o.handle for o in [*noise, fact]}
    assert len(await originals.search("s1", "seg_999999")) == 7  # no exact hit: the words, as before
    # the tool's excerpts are cut around the identifier, not around its parts elsewhere in the text
    answer = await tool_answer('{"query": "seg_1a2b3c"}', originals, "s1", max_tokens=4000, count=lambda t: len(t) // 4,
                               prompts=Prompts())
    assert answer.outcome == "hit" and "seg_1a2b3c" in answer.text and "bbbbbbbbbb" not in answer.text


async def test_originals_are_found_only_in_their_own_scope(store: Store) -> None:
    await store.put_original(ORIG_A + "h1", b"alpha secret 7f3e9a1 of scope a", ["7f3e9a1"])
    await store.put_original(ORIG_B + "h9", b"beta words of scope b", ["b0b0b0b1"])
    assert await store.find_originals(ORIG_B, ["alpha", "secret"], ["7f3e9a1"], 10) == []
    assert await store.find_originals(ORIG_A, ["beta", "words"], ["b0b0b0b1"], 10) == []
    assert await store.find_originals(ORIG_B, ["beta"], [], 10) == [ORIG_B + "h9"]


async def test_an_originals_index_goes_with_it(store: Store, clock: FakeClock) -> None:
    await store.put_original(ORIG_A + "gone", b"expiring words here", ["id-42x"])
    await store.put_original(ORIG_A + "kept", b"other words here", [])
    assert await store.delete(ORIG_A + "gone") is True
    assert await store.find_originals(ORIG_A, ["expiring"], ["id-42x"], 10) == []
    # an overwrite re-indexes: the old words and identifiers find nothing
    await store.put_original(ORIG_A + "kept", b"replacement text", ["new-id-7"])
    assert await store.find_originals(ORIG_A, ["other"], [], 10) == []
    assert await store.find_originals(ORIG_A, ["replacement"], ["new-id-7"], 10) == [ORIG_A + "kept"]
    clock.advance(TTL + 1)  # expiry by the clock
    assert await store.find_originals(ORIG_A, ["replacement"], ["new-id-7"], 10) == []
    assert await store.get(ORIG_A + "kept") is None


async def test_originals_share_the_ttl_and_a_read_refreshes_them(store: Store, clock: FakeClock) -> None:
    await store.put_original(ORIG_A + "h", b"some words", [])
    clock.advance(TTL - 1)
    assert await store.get(ORIG_A + "h") == b"some words"  # a lookup is a use
    clock.advance(TTL - 1)
    assert await store.find_originals(ORIG_A, ["words"], [], 10) == [ORIG_A + "h"]
    clock.advance(2)
    assert await store.find_originals(ORIG_A, ["words"], [], 10) == []


async def test_store_growth_with_originals_stays_within_max_records(
    backend: str, make_store: MakeStore, clock: FakeClock
) -> None:
    """At the edge: originals and records share one bound (on a cluster, each group of keys has
    its own: a scope's originals, its summaries); evicted originals leave no index."""
    store = make_store(max_records=5)
    await store.put("sum:x", b"record")
    for i in range(12):
        await store.put_original(f"{ORIG_A}h{i:02d}", f"common word unique{i}".encode(), [f"ident-{i}x"])
        clock.advance(1)
    keys = ["sum:x"] + [f"{ORIG_A}h{i:02d}" for i in range(12)]
    live = await store.get_many(keys)
    newest = [f"{ORIG_A}h{i:02d}" for i in range(7, 12)]  # the newest five: the bound
    assert sorted(live) == newest + (["sum:x"] if backend == "redis-cluster" else [])
    found = await store.find_originals(ORIG_A, ["common"], [], 100)
    assert sorted(found) == newest
    assert await store.find_originals(ORIG_A, ["unique3"], ["ident-3x"], 10) == []
    clock.advance(TTL + 1)
    assert await store.find_originals(ORIG_A, ["common"], [], 100) == []


async def test_replicas_find_each_others_originals(backend: str, make_store: MakeStore) -> None:
    if backend == "memory":
        pytest.skip("memory:// is private to one process")
    a, b = make_store(), make_store()
    await a.put_original(ORIG_A + "h", b"shared across replicas", ["rep-1a"])
    assert await b.find_originals(ORIG_A, ["replicas"], [], 10) == [ORIG_A + "h"]
    assert await b.find_originals(ORIG_A, [], ["rep-1a"], 10) == [ORIG_A + "h"]


# -- logs (the journal) -------------------------------------------------------------------------


async def test_a_log_keeps_its_newest_entries_in_order(store: Store, clock: FakeClock) -> None:
    assert await store.tail("j", 10) == []
    for i in range(7):
        clock.advance(1)
        await store.append("j", f"e{i}".encode(), max_len=5)
    entries = await store.tail("j", 10)
    assert [v for _, v in entries] == [b"e2", b"e3", b"e4", b"e5", b"e6"]
    assert [t for t, _ in entries] == [clock() - 4, clock() - 3, clock() - 2, clock() - 1, clock()]
    assert [v for _, v in await store.tail("j", 2)] == [b"e5", b"e6"]
    assert await store.tail("j", 0) == []
    assert await store.tail("other", 5) == []


async def test_log_entries_round_trip_exactly(store: Store) -> None:
    values = [b"", b"with spaces and\nnewlines", bytes(range(256)), "ünïcode".encode()]
    for v in values:
        await store.append("bin", v, max_len=10)
    assert [v for _, v in await store.tail("bin", 10)] == values


async def test_log_entries_expire_by_the_time_they_were_added(store: Store, clock: FakeClock) -> None:
    await store.append("j", b"old", max_len=10)
    clock.advance(TTL / 2)
    await store.append("j", b"new", max_len=10)
    assert [v for _, v in await store.tail("j", 10)] == [b"old", b"new"]  # reading refreshes nothing
    clock.advance(TTL / 2 + 0.1)
    assert [v for _, v in await store.tail("j", 10)] == [b"new"]
    clock.advance(TTL)
    assert await store.tail("j", 10) == []


async def test_logs_live_apart_from_records_and_their_bound(make_store: MakeStore, clock: FakeClock) -> None:
    store = make_store(max_records=2)
    await store.put("j", b"record")
    for i in range(5):
        await store.append("j", b"entry", max_len=5)
    clock.advance(1)
    await store.put("a", b"1")
    clock.advance(1)
    await store.put("b", b"2")  # the bound of 2 records evicts "j"; the log of the same name stays
    assert await store.get_many(["j", "a", "b"]) == {"a": b"1", "b": b"2"}
    assert len(await store.tail("j", 10)) == 5


async def test_replicas_share_a_log(backend: str, make_store: MakeStore) -> None:
    if backend == "memory":
        pytest.skip("memory:// is private to one process")
    a, b = make_store(), make_store()
    await a.append("j", b"from a", max_len=3)
    await b.append("j", b"from b", max_len=3)
    assert [v for _, v in await a.tail("j", 5)] == [b"from a", b"from b"]


async def test_resilient_store_answers_an_empty_log_when_down(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_bytes(b"")
    store = ResilientStore(SqliteStore(str(tmp_path / "a-file" / "s.db"), ttl_s=TTL, max_records=10))
    await store.append("j", b"x", max_len=3)
    assert await store.tail("j", 3) == []
    assert not store.healthy and store.errors >= 1
    await store.close()


# -- SQLite specifics -------------------------------------------------------------------------


async def test_sqlite_persists_across_reopen(tmp_path: Path, clock: FakeClock) -> None:
    path = str(tmp_path / "nested" / "dir" / "store.db")
    first = SqliteStore(path, ttl_s=TTL, max_records=10, clock=clock)
    await first.put("a", b"\x00\xff")
    await first.put("secret", b"s", ttl_s=None)
    await first.close()
    second = SqliteStore(path, ttl_s=TTL, max_records=10, clock=clock)
    try:
        assert await second.get_many(["a", "secret"]) == {"a": b"\x00\xff", "secret": b"s"}
    finally:
        await second.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_sqlite_sweeps_expired_rows(tmp_path: Path, clock: FakeClock) -> None:
    path = str(tmp_path / "store.db")
    store = SqliteStore(path, ttl_s=TTL, max_records=10, clock=clock)
    try:
        await store.put("old", b"1")
        clock.advance(3600)
        await store.put("new", b"2")  # a write sweeps when the last sweep is long enough ago
        with sqlite3.connect(path) as conn:
            assert conn.execute("SELECT key FROM kv").fetchall() == [("new",)]
    finally:
        await store.close()


async def test_sqlite_unwritable_location_raises_store_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")  # a file where a directory must go: fails even when run as root
    store = SqliteStore(str(blocker / "store.db"), ttl_s=TTL, max_records=10)
    try:
        with pytest.raises(StoreUnavailable):
            await store.put("a", b"1")
        with pytest.raises(StoreUnavailable):
            await store.get("a")
        with pytest.raises(StoreUnavailable):
            await store.ping()
    finally:
        await store.close()
    with pytest.raises(StoreUnavailable):
        await store.get("a")  # closed


# -- Redis specifics --------------------------------------------------------------------------


@pytest.mark.redis
async def test_redis_bookkeeping_expires_with_what_it_tracks(redis_server: RedisServer, clock: FakeClock) -> None:
    """The LRU ZSET, the TTL HASH and the recall index carry Redis's own expiry, as the values do:
    what nobody uses any more leaves nothing behind (only a permanent key stays)."""
    namespace = f"test-{uuid.uuid4().hex}:"
    store = RedisStore(redis_server.url, ttl_s=100, max_records=10, clock=clock, namespace=namespace)
    await store.put("sum:s:c", b"record")
    await store.put_original("orig:s:h", b"two words", ["Id_1"])
    await store.put("secret", b"s", ttl_s=None)
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        index_set = f"{namespace}ix:orig:s:w:two"
        await client.pexpire(index_set, 5000)
        assert await store.get("orig:s:h") == b"two words"  # a read extends the index as the value
        assert await client.pttl(index_set) > 5000
        ttls = {k.decode()[len(namespace):]: await client.pttl(k) for k in await client.keys(namespace + "*")}
    finally:
        await client.aclose()
        await store.close()
    assert ttls.pop("k:secret") == -1
    assert sorted(ttls) == ["ix:orig:s:i:Id_1", "ix:orig:s:w:two", "ix:orig:s:w:words", "ixk:orig:s:h",
                            "k:orig:s:h", "k:sum:s:c", "lru", "ttl"]
    assert all(0 < ms <= 100_000 for ms in ttls.values()), ttls


@pytest.mark.redis
async def test_redis_down_raises_store_unavailable(private_redis: RedisServer) -> None:
    store = RedisStore(private_redis.url, ttl_s=TTL, max_records=10)
    try:
        await store.ping()
        private_redis.stop()
        with pytest.raises(StoreUnavailable):
            await store.ping()
        with pytest.raises(StoreUnavailable):
            await store.put("a", b"1")
        with pytest.raises(StoreUnavailable):
            await store.get("a")
    finally:
        await store.close()


# -- ResilientStore ---------------------------------------------------------------------------


def _records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "proxy.store" and r.levelno == level]


class CountingStore(MemoryStore):
    """A memory store that counts the calls reaching it and can be switched off."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(ttl_s=TTL, max_records=10, clock=clock)
        self.down = False
        self.calls = 0

    def _check(self) -> None:
        self.calls += 1
        if self.down:
            raise StoreUnavailable("switched off")

    async def get_many(self, keys: list[str]) -> dict[str, bytes]:
        self._check()
        return await super().get_many(keys)

    async def put(self, key: str, value: bytes, ttl_s: float | None = ...) -> None:  # type: ignore[assignment]
        self._check()
        await super().put(key, value, ttl_s)

    async def add(self, key: str, value: bytes, ttl_s: float | None = ...) -> bool:  # type: ignore[assignment]
        self._check()
        return await super().add(key, value, ttl_s)

    async def ping(self) -> None:
        self._check()


@pytest.mark.redis
async def test_resilient_store_rides_out_a_redis_outage(
    private_redis: RedisServer, caplog: pytest.LogCaptureFixture, clock: FakeClock
) -> None:
    caplog.set_level(logging.DEBUG, logger="proxy.store")
    monotonic = FakeClock()
    store = ResilientStore(RedisStore(private_redis.url, ttl_s=TTL, max_records=10), monotonic=monotonic)
    try:
        await store.put("scope-hash", b"secret-value")
        assert await store.get("scope-hash") == b"secret-value"
        assert store.healthy

        private_redis.stop()
        assert await store.get("scope-hash") is None
        assert await store.get_many(["scope-hash"]) == {}
        await store.put("scope-hash", b"secret-value")
        assert await store.add("lock", b"me") is False
        assert await store.delete("lock", expected=b"me") is False
        await store.ping()
        assert not store.healthy
        warnings = _records(caplog, logging.WARNING)
        assert len(warnings) == 1
        assert "RedisStore" in warnings[0].getMessage()

        private_redis.start()  # same port, empty: nothing was persisted
        await store.put("scope-hash", b"during the back-off")  # not even tried
        monotonic.advance(store.retry_after_s)
        await store.put("scope-hash", b"again")
        assert await store.get("scope-hash") == b"again"
        assert store.healthy
        assert len(_records(caplog, logging.INFO)) == 1
        assert len(_records(caplog, logging.WARNING)) == 1
        assert "scope-hash" not in caplog.text and "secret-value" not in caplog.text
    finally:
        await store.close()


async def test_resilient_store_swallows_any_backend_error(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(MemoryStore):
        async def get_many(self, keys: list[str]) -> dict[str, bytes]:
            raise RuntimeError("bug")

    monotonic = FakeClock()
    store = ResilientStore(Broken(ttl_s=TTL, max_records=10), monotonic=monotonic)
    with caplog.at_level(logging.INFO, logger="proxy.store"):
        assert await store.get("a") is None
        monotonic.advance(store.retry_after_s)
        assert await store.get_many(["a"]) == {}
        assert not store.healthy
        monotonic.advance(store.retry_after_s)
        await store.put("a", b"1")  # the write works: the outage is over
        assert store.healthy
    assert [r.levelno for r in caplog.records if r.name == "proxy.store"] == [logging.WARNING, logging.INFO]


async def test_resilient_store_backs_off_a_backend_that_fails(clock: FakeClock) -> None:
    monotonic = FakeClock()
    inner = CountingStore(clock)
    store = ResilientStore(inner, retry_after_s=1.0, monotonic=monotonic)
    await store.put("a", b"1")
    inner.down = True
    assert await store.get("a") is None  # fails: the outage starts
    assert inner.calls == 2
    for _ in range(20):  # within the back-off nothing reaches the backend; every call is a miss
        assert await store.get("a") is None
        assert await store.add("lock", b"me") is False
        await store.put("b", b"2")
    assert inner.calls == 2
    monotonic.advance(0.99)
    assert await store.get("a") is None
    assert inner.calls == 2
    monotonic.advance(0.02)  # the back-off is over: one call tries again, fails, backs off again
    assert await store.get("a") is None
    assert await store.get("a") is None
    assert inner.calls == 3 and not store.healthy
    inner.down = False
    assert await store.get("a") is None  # still backing off, although the backend is back
    monotonic.advance(1.0)
    assert await store.get("a") == b"1"  # the trial call succeeds and ends the outage
    assert store.healthy
    assert await store.get("a") == b"1"
    assert inner.calls == 5


async def test_resilient_store_sends_one_trial_call_at_a_time(clock: FakeClock) -> None:
    class Slow(CountingStore):
        def __init__(self, clock: FakeClock) -> None:
            super().__init__(clock)
            self.release = asyncio.Event()

        async def get_many(self, keys: list[str]) -> dict[str, bytes]:
            self._check()
            await self.release.wait()  # a backend that does not answer (yet)
            raise StoreUnavailable("timed out")

    monotonic = FakeClock()
    inner = Slow(clock)
    store = ResilientStore(inner, monotonic=monotonic)
    inner.release.set()
    assert await store.get("a") is None  # the outage starts
    inner.release.clear()
    monotonic.advance(store.retry_after_s)
    trial = asyncio.create_task(store.get("a"))
    await asyncio.sleep(0)
    assert inner.calls == 2
    # While the trial call hangs, the other calls do not queue up behind the dead backend.
    assert await asyncio.wait_for(asyncio.gather(*(store.get("a") for _ in range(10))), 1) == [None] * 10
    assert inner.calls == 2
    inner.release.set()
    assert await trial is None
    assert not store.healthy


async def test_resilient_store_ping_asks_the_backend_during_the_back_off(clock: FakeClock) -> None:
    inner = CountingStore(clock)
    store = ResilientStore(inner, monotonic=FakeClock())
    inner.down = True
    await store.ping()
    assert not store.healthy
    inner.down = False
    assert await store.get("a") is None  # backing off
    await store.ping()  # an explicit health check goes out and ends the outage
    assert store.healthy
    assert inner.calls == 2


async def test_resilient_store_over_unwritable_sqlite(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_bytes(b"")
    store = ResilientStore(SqliteStore(str(tmp_path / "a-file" / "x.db"), ttl_s=TTL, max_records=10))
    assert await store.add("lock", b"me") is False
    assert await store.get("lock") is None
    assert not store.healthy
    await store.close()


# -- open_store -------------------------------------------------------------------------------


async def test_open_store_picks_backend_by_url(tmp_path: Path) -> None:
    limits = {"ttl_s": 60.0, "max_records": 5}
    memory = open_store("memory://", **limits)
    assert isinstance(memory, MemoryStore) and memory.ttl_s == 60.0 and memory.max_records == 5

    relative = open_store("sqlite:///data/store.db", **limits)
    assert isinstance(relative, SqliteStore) and relative.path == "data/store.db"
    absolute = open_store(f"sqlite:///{tmp_path}/store.db", **limits)
    assert isinstance(absolute, SqliteStore) and absolute.path == f"{tmp_path}/store.db"
    await relative.close()
    await absolute.close()
    assert not Path("data/store.db").exists()  # nothing is created before the first call

    for url in ("redis://127.0.0.1:6379/0", "rediss://user:pw@redis.example:6380/2"):
        store = open_store(url, **limits)
        assert isinstance(store, RedisStore)
        await store.close()


@pytest.mark.parametrize("url", ["sqlite:///", "sqlite://x.db", "postgres://u:pw@h/db", "store.db", ""])
def test_open_store_rejects_unknown_urls(url: str) -> None:
    with pytest.raises(ValueError) as info:
        open_store(url, ttl_s=60, max_records=5)
    assert "pw" not in str(info.value)
