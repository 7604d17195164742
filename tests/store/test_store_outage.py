"""A store that is down never fails a request (issue 5 item 5), with a real redis-server and real
SQLite files: the proxy carries on without reuse, warns once per outage and recovers by itself."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from support.conversations import MODEL, WINDOW, request_points, send, tau_conversations
from proxy.fakes.chat import FakeUpstream
from support.invariants import check_forwarded
from support.redis_server import RedisServer, redis_server_fixture

ALLOWED = {"none", "summarized", "reused", "failed-open"}

outage_redis = redis_server_fixture("outage_redis")


def settings(store_url: str) -> dict:
    return {
        "models": {MODEL: {"context_window": WINDOW}},
        "compaction": {"prepare_percent": 0},
        "store": {"url": store_url},
    }


def store_logs(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "proxy.store" and r.levelno == level]


@pytest.mark.redis
async def test_redis_stopped_mid_replay(
    upstream: FakeUpstream, make_proxy, outage_redis: RedisServer, fixtures_dir: Path, caplog: pytest.LogCaptureFixture, client_for
) -> None:
    caplog.set_level(logging.INFO, logger="proxy.store")
    upstream.window = WINDOW
    # Three replicas on one Redis, all started while it is up, so they share its scope secret.
    a, b, c = [await make_proxy(upstream.base_url, settings(outage_redis.url)) for _ in range(3)]
    points = iter(request_points(tau_conversations(fixtures_dir, 1)[0]))

    async def replay_on(proxy, until_compacted: bool, at_least: int = 1) -> list[str]:
        statuses: list[str] = []
        for history in points:
            turn = await send(client_for(proxy), history)
            check_forwarded(history, upstream.chat_requests[-1]["messages"], compacted=turn.status in ("summarized", "reused"))
            statuses.append(turn.status)
            if len(statuses) >= at_least and (not until_compacted or "summarized" in statuses):
                return statuses
        pytest.fail(f"the conversation ended too early: {statuses}")

    assert (await replay_on(a, until_compacted=True))[-1] == "summarized"
    assert await replay_on(a, until_compacted=False) == ["reused"]

    outage_redis.stop()
    during = await replay_on(a, until_compacted=True, at_least=3)
    assert set(during) <= ALLOWED and "summarized" in during  # a fresh summary, made without the store
    assert not a.state.store.healthy
    warnings = store_logs(caplog, logging.WARNING)
    assert len(warnings) == 1 and "RedisStore" in warnings[0]

    outage_redis.start()  # same port, empty: the records are gone
    await a.state.store.ping()  # what the first call after the back-off does
    assert a.state.store.healthy
    assert len(store_logs(caplog, logging.INFO)) == 1
    # Reuse through the store is back: B compacts, and C, which never saw the conversation, reuses
    # B's summary from Redis and forwards the same bytes.
    history = next(points)
    assert (await send(client_for(b), history)).status == "summarized"
    assert (await send(client_for(c), history)).status == "reused"
    assert upstream.records("chat")[-1].body == upstream.records("chat")[-2].body
    assert len(store_logs(caplog, logging.WARNING)) == 1


async def test_an_unwritable_sqlite_file_never_fails_a_request(
    upstream: FakeUpstream, make_proxy, tmp_path: Path, fixtures_dir: Path, caplog: pytest.LogCaptureFixture, client_for
) -> None:
    caplog.set_level(logging.INFO, logger="proxy.store")
    upstream.window = WINDOW
    (tmp_path / "a-file").write_bytes(b"")  # where the store's directory must go: fails even as root
    proxy = await make_proxy(upstream.base_url, settings(f"sqlite:///{tmp_path}/a-file/store.db"))
    statuses = []
    for history in request_points(tau_conversations(fixtures_dir, 1)[0]):
        turn = await send(client_for(proxy), history)
        check_forwarded(history, upstream.chat_requests[-1]["messages"], compacted=turn.status in ("summarized", "reused"))
        statuses.append(turn.status)
    assert set(statuses) <= ALLOWED
    assert statuses.count("summarized") >= 2 and "reused" in statuses  # compaction works, storeless
    assert not proxy.state.store.healthy
    assert len(store_logs(caplog, logging.WARNING)) == 1  # one warning for the whole outage


@pytest.mark.redis
async def test_replicas_converge_on_one_scope_secret_after_redis_loses_it(
    upstream: FakeUpstream, make_proxy, outage_redis: RedisServer
) -> None:
    a = await make_proxy(upstream.base_url, settings(outage_redis.url))
    outage_redis.stop()
    outage_redis.start()  # no persistence: the generated secret is gone
    b = await make_proxy(upstream.base_url, settings(outage_redis.url))  # generates another one
    assert b.state.scope_secret != a.state.scope_secret
    await a.state.refresh_scope_secret()  # what each replica does every minute
    assert a.state.scope_secret == b.state.scope_secret

    outage_redis.stop()
    outage_redis.start()
    await a.state.refresh_scope_secret()  # the store gets the secret back from a running replica
    c = await make_proxy(upstream.base_url, settings(outage_redis.url))
    assert c.state.scope_secret == a.state.scope_secret
