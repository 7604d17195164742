"""Redis Cluster as the store, on a real three-node cluster of redis-server on loopback
(tests/support/redis_cluster.py). The store contract itself runs on the cluster in
tests/test_store_contract.py; here: the key layout, the URL, and two proxy replicas serving a
compacting session while one node dies and comes back.
"""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import redis

from proxy.config import ConfigError, load_config
from proxy.fake_upstream import FakeUpstream
from proxy.store import StoreUnavailable, open_store
from proxy.store.redis_cluster import RedisClusterStore, group_tag, parse_cluster_url
from support.clock import FakeClock
from support.conversations import MODEL, WINDOW, request_points, send, tau_conversations
from support.invariants import check_forwarded
from support.redis_cluster import RedisCluster, redis_cluster, redis_cluster_fixture  # noqa: F401
from support.replicas import Replica, running_replicas

ALLOWED = {"none", "summarized", "reused", "failed-open"}
SETTINGS = {
    "models": {MODEL: {"context_window": WINDOW}},
    # byte-for-byte comparisons between processes run without learning the token ratio
    "compaction": {"prepare_percent": 0, "learn_token_ratio": False},
}


def _keys(cluster: RedisCluster, namespace: str) -> dict[int, list[str]]:
    """Every key under `namespace` on each node (by port)."""
    found = {}
    for node in cluster.nodes:
        with redis.Redis(host="127.0.0.1", port=node.port) as r:
            found[node.port] = [k.decode() for k in r.keys(namespace + "*")]
    return found


# -- layout -------------------------------------------------------------------------------------


def test_group_tags() -> None:
    assert group_tag("sum:scope1:abc") == "sum:scope1"
    assert group_tag("orig:scope1:h7") == group_tag("orig:scope1:x") == "orig:scope1"
    assert group_tag("lock:sum:s:c") == "lock:sum:s"
    assert group_tag("plain") == group_tag(":x") == "-"  # never the empty tag `{}`
    assert group_tag("x{y}:z") == "x(y)"  # a brace in a scope cannot end the tag early


async def test_every_key_of_a_group_is_in_one_slot_and_expires(redis_cluster: RedisCluster) -> None:
    """What the scripts touch (value, bookkeeping, the recall index) is one slot per group; the
    bookkeeping and index carry a native expiry, so a group nobody uses again leaves nothing."""
    namespace = "layout-1:"
    store = RedisClusterStore(redis_cluster.url, ttl_s=100, max_records=100, clock=FakeClock(), namespace=namespace)
    try:
        for scope in ("s1", "s2", "s3", "s4"):
            await store.put(f"sum:{scope}:c1", b"record")
            await store.put_original(f"orig:{scope}:h1", b"some words here", ["Ident_1"])
        assert len(await store.get_many([f"sum:s{i}:c1" for i in range(1, 5)])) == 4
        assert await store.find_originals("orig:s3:", ["words"], [], 5) == ["orig:s3:h1"]
    finally:
        await store.close()
    per_node = _keys(redis_cluster, namespace)
    assert sum(1 for keys in per_node.values() if keys) >= 2  # the groups spread over the nodes
    with redis.RedisCluster(host="127.0.0.1", port=redis_cluster.nodes[0].port) as r:
        slots: dict[str, set[int]] = {}
        for keys in per_node.values():
            for k in keys:
                slots.setdefault(k[k.index("{") : k.index("}") + 1], set()).add(r.keyslot(k))
                assert 0 < r.pttl(k) <= 100_000, k  # value, lru, ttl, index sets: all expire
        assert len(slots) == 8 and all(len(s) == 1 for s in slots.values()), slots


def test_cluster_urls() -> None:
    parsed = parse_cluster_url("redis+cluster://user:p%40ss@10.0.0.1:7000,10.0.0.2:7001/")
    assert [(n.host, n.port) for n in parsed["startup_nodes"]] == [("10.0.0.1", 7000), ("10.0.0.2", 7001)]
    assert (parsed["username"], parsed["password"], parsed["ssl"]) == ("user", "p@ss", False)
    assert parse_cluster_url("rediss+cluster://h:1")["ssl"] is True
    assert isinstance(open_store("redis+cluster://127.0.0.1:1", ttl_s=1, max_records=1), RedisClusterStore)
    for bad in ("redis+cluster://", "redis+cluster://:secret@hostonly/"):
        with pytest.raises(ValueError) as e:
            parse_cluster_url(bad)
        assert "secret" not in str(e.value)


async def test_an_unreachable_cluster_is_store_unavailable() -> None:
    """The cluster client's own error (no seed node answers) is no RedisError: still an outage."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    store = RedisClusterStore(f"redis+cluster://127.0.0.1:{port}", ttl_s=10, max_records=10)
    try:
        for call in (lambda: store.get("a"), lambda: store.put("a", b"v"), store.ping, lambda: store.tail("j", 1)):
            with pytest.raises(StoreUnavailable, match="RedisClusterUnreachableError"):
                await call()
    finally:
        await store.close()


def test_a_cluster_url_without_nodes_is_refused_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTION_PROXY_STORE__URL", "redis+cluster://:pw@/")
    with pytest.raises(ConfigError) as e:
        load_config(None)
    assert "seed node" in str(e.value) and "pw" not in str(e.value)


# A cluster per test for the tests that kill a node.
doomed_cluster = redis_cluster_fixture("doomed_cluster", scope="function")


def _script_attempts(nodes: list) -> int:
    """Scripts the nodes ran or refused (CLUSTERDOWN) since their stats were last reset."""
    total = 0
    for node in nodes:
        with redis.Redis(host="127.0.0.1", port=node.port) as r:
            stats = r.info("commandstats").get("cmdstat_evalsha", {})
            total += stats.get("calls", 0) + stats.get("rejected_calls", 0)
            r.config_resetstat()
    return total


@pytest.mark.redis
async def test_a_cluster_that_is_down_costs_a_call_one_attempt(doomed_cluster: RedisCluster) -> None:
    """A cluster that refuses (CLUSTERDOWN) is an outage: not retried, since the client waits
    0.25 s before failing every attempt; a restarted node's dead connection still is, at once."""
    store = RedisClusterStore(doomed_cluster.url, ttl_s=100, max_records=10, clock=FakeClock(), namespace="down:")
    keys = [f"sum:s{i}:c" for i in range(12)]  # groups on every node
    try:
        await store.get_many(keys)
        victim, living = doomed_cluster.nodes[1], [doomed_cluster.nodes[0], doomed_cluster.nodes[2]]
        on_living = next(k for k in keys if _port_of(doomed_cluster, k) != victim.port)
        victim.stop(kill=True)
        doomed_cluster.wait_state("fail", living)
        _script_attempts(living)
        with pytest.raises(StoreUnavailable, match="ClusterDownError"):
            await store.get(on_living)
        assert _script_attempts(living) == 1
        victim.start()
        doomed_cluster.wait_ok()
        assert await store.get_many(keys) == {}  # every node answers again, the first call included
    finally:
        await store.close()


def _port_of(cluster: RedisCluster, key: str) -> int:
    """The port of the node serving `key`'s group (asked while the cluster is up)."""
    with redis.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port) as r:
        return r.get_node_from_key("{" + group_tag(key) + "}").port


# -- two replicas, one node killed mid-session ----------------------------------------------------


# A cluster of this module's own: its test kills a node.
own_cluster = redis_cluster_fixture("own_cluster", scope="module")


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeUpstream]:
    with FakeUpstream(window=WINDOW) as f:
        yield f


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory, fake: FakeUpstream, own_cluster: RedisCluster) -> Iterator[list[Replica]]:
    with running_replicas(tmp_path_factory.mktemp("cluster-replicas"), fake.base_url, own_cluster.url, SETTINGS) as pair:
        yield pair


def _logs(replicas: list[Replica]) -> str:
    """The replicas' log tails, for a failure's message."""
    return "\n".join(f"--- {r.name}:\n{r.log_text()[-1500:]}" for r in replicas)


def _store_state(replica: Replica) -> str:
    """What the replica's /healthz says of its store: ok or down."""
    with urllib.request.urlopen(replica.root + "/healthz", timeout=5) as resp:
        return json.load(resp)["store"]


@pytest.mark.redis
async def test_two_replicas_ride_out_a_dead_node_and_catch_up(
    fake: FakeUpstream, replicas: list[Replica], own_cluster: RedisCluster, fixtures_dir: Path, client_for
) -> None:
    a, b = [client_for(r) for r in replicas]
    first, second = tau_conversations(fixtures_dir, 2)
    points = iter(request_points(first))
    fake.clear_requests()

    async def turn(client: openai.AsyncOpenAI, history: list) -> str:
        t = await send(client, history)  # an error answer (a 500) raises here
        check_forwarded(history, fake.chat_requests[-1]["messages"], compacted=t.status in ("summarized", "reused"))
        return t.status

    async def until_summarized(clients: list[openai.AsyncOpenAI], at_least: int = 1) -> tuple[list[str], list]:
        statuses: list[str] = []
        for history in points:
            statuses.append(await turn(clients[len(statuses) % len(clients)], history))
            if len(statuses) >= at_least and "summarized" in statuses:
                return statuses, history
        pytest.fail(f"the conversation ended too early: {statuses}")

    # Up: A compacts; B, which never saw the conversation, reuses A's summary from the cluster.
    _, history = await until_summarized([a])
    status = await turn(b, history)
    assert status == "reused", (status, _logs(replicas))
    chat = fake.records("chat")
    assert chat[-1].body == chat[-2].body  # byte for byte

    victim = own_cluster.nodes[1]
    victim.stop(kill=True)
    # The others notice (cluster-node-timeout) and, requiring full coverage, answer nothing: the
    # store is down for every key, whichever node it is on.
    own_cluster.wait_state("fail", [n for n in own_cluster.nodes if n is not victim])
    # Down: both replicas go on serving, alternately, and make a summary without the store.
    during, _ = await until_summarized([a, b])
    assert set(during) <= ALLOWED and "summarized" in during, during
    assert "down" in {_store_state(r) for r in replicas}, _logs(replicas)

    victim.start()  # same port, its slots from nodes.conf, its keys gone (no persistence)
    own_cluster.wait_ok()
    await asyncio.sleep(1.1)  # past the replicas' back-off (ResilientStore.retry_after_s): their next call asks
    seen: list[str] = []
    # Back: B compacts another conversation and A reuses B's summary through the store again.
    for history in request_points(second):
        seen.append(await turn(b, history))
        if seen[-1] == "summarized":
            status = await turn(a, history)
            assert status == "reused", (status, seen, _logs(replicas))
            chat = fake.records("chat")
            assert chat[-1].body == chat[-2].body
            break
    else:
        pytest.fail(f"the conversation ended before a compaction after the node came back: {during} {seen}")
    assert {_store_state(r) for r in replicas} == {"ok"}
    for r in replicas:
        assert "Traceback" not in r.log_text()
