"""Secrets (issue 7 item 5, design.md § Security): a planted client key, a planted configured key and a planted
scope secret never appear in logs (every logger at DEBUG, in-process and a real process's own
log), error bodies, response headers, the store (the SQLite file's bytes, every Redis key and
value), or in the body of any request the proxy makes; the summarizer calls carry the client's own
key and nothing else. No unsalted hash of a key is stored either. Message content is logged only
with server.log_content on.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import socket
from typing import Any

import orjson
import pytest

from support.client import Answer, auth, get, post
from support.compaction_helpers import chat_history
from proxy.fakes.chat import FakeUpstream
from support.redis_server import RedisServer, redis_server  # noqa: F401
from support.replicas import Replica

MODEL = "gpt-4"
TAG = secrets.token_hex(8)
CLIENT_KEY = f"sk-PLANTED-client-{TAG}"
CONFIG_KEY = f"sk-PLANTED-config-{TAG}"
SCOPE_SECRET = f"PLANTED-scope-secret-{TAG}"
CONTENT = f"PLANTED-content-{TAG}"


def needles() -> list[bytes]:
    """Every form a leak could take: the secrets, their distinctive parts, unsalted hashes."""
    out = [CLIENT_KEY, CONFIG_KEY, SCOPE_SECRET, f"client-{TAG}", f"config-{TAG}", f"scope-secret-{TAG}"]
    for key in (CLIENT_KEY, CONFIG_KEY):
        for text in (key, f"Bearer {key}"):
            out += [hashlib.sha256(text.encode()).hexdigest()[:16], hashlib.md5(text.encode()).hexdigest()[:16]]
    return [n.encode() for n in out]


def assert_clean(where: str, data: bytes | str) -> None:
    raw = data.encode() if isinstance(data, str) else data
    leaked = [n.decode() for n in needles() if n in raw]
    assert not leaked, f"{where} holds {leaked}"


def settings(store_url: str, **server: Any) -> dict[str, Any]:
    return {
        "upstream": {"api_key": CONFIG_KEY},
        "store": {"url": store_url, "scope_secret": SCOPE_SECRET},
        "server": {"log_level": "debug", **server},
        "models": {MODEL: {"context_window": 6000}},
        "compaction": {"prepare_percent": 0},
        "tool_results": {"threshold_tokens": 300},
    }


def _tool_conversation() -> list[dict[str, Any]]:
    payload = "\n".join(f"line {i}: ticket TCK-{i:05d} closed by agent_{i % 9}" for i in range(150))
    return [
        {"role": "user", "content": f"Summarize the tickets. {CONTENT}"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_s", "type": "function", "function": {"name": "list_tickets", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_s", "content": payload},
    ]


async def scenario(base_url: str, upstream: FakeUpstream) -> list[Answer]:
    """Every kind of request and failure, with the planted client key (or none: the configured key)."""
    history = chat_history(12, 150)
    history[-1]["content"] += " " + CONTENT
    bodies: list[tuple[dict[str, Any], dict[str, str]]] = [
        ({"model": MODEL, "messages": history}, {"Authorization": f"Bearer {CLIENT_KEY}"}),  # compaction
        ({"model": MODEL, "messages": history, "stream": True}, {"Authorization": f"Bearer {CLIENT_KEY}"}),
        ({"model": MODEL, "messages": _tool_conversation()}, {"Authorization": f"Bearer {CLIENT_KEY}"}),
        ({"model": MODEL, "messages": [{"role": "user", "content": CONTENT}]}, {}),  # the configured key
        ({"model": MODEL, "messages": [{"role": "robot", "content": CONTENT}]}, {"Authorization": f"Bearer {CLIENT_KEY}"}),
        ({"model": 7, "messages": []}, {"Authorization": f"Bearer {CLIENT_KEY}"}),
    ]
    out = [await post(base_url, orjson.dumps(body), headers) for body, headers in bodies]
    upstream.require_api_key = "sk-someone-else"  # the upstream refuses the key: its 401 passes through
    out.append(await post(base_url, orjson.dumps(bodies[3][0]), auth(CLIENT_KEY)))
    upstream.require_api_key = None
    out.append(await get(base_url, "/models", auth(CLIENT_KEY)))
    statuses = [o[0] for o in out]
    assert statuses == [200, 200, 200, 200, 400, 400, 401, 200], statuses
    assert out[0][1]["x-compaction-status"] == "summarized" and out[2][1]["x-compaction-tool-results"] == "1"
    return out


def check_answers_and_upstream(answers: list[Answer], upstream: FakeUpstream) -> None:
    for status, headers, body in answers:
        assert_clean(f"a {status} answer's body", body)
        assert_clean(f"a {status} answer's headers", repr(headers))
    for rec in upstream.requests:
        assert_clean(f"the body of a {rec.kind} request to the upstream", rec.body)
    summarizer = upstream.records("summarizer")
    assert {r.summarizer_kind for r in summarizer} == {"history", "tool"}
    for rec in summarizer:
        # only the client's own credential, and no other header of the client's
        assert rec.headers["authorization"] == f"Bearer {CLIENT_KEY}"
        assert not any(h.startswith("x-compaction") for h in rec.headers)


async def test_no_secret_in_logs_answers_requests_or_the_sqlite_file(upstream, make_proxy, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)  # every logger, the proxy's and aiohttp's
    db = tmp_path / "store.db"
    proxy = await make_proxy(upstream.base_url, settings(f"sqlite:///{db}"))
    answers = await scenario(proxy.base_url, upstream)
    # an unreachable upstream: the proxy's own 502
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    dead = await make_proxy(f"http://127.0.0.1:{closed}/v1", settings("memory://"))
    answers.append(await post(dead, orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}),
                              auth(CLIENT_KEY)))
    assert answers[-1][0] == 502
    await proxy.close()  # flushes the store to its file
    check_answers_and_upstream(answers, upstream)
    logged = "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    assert "proxy.chat" in logged  # the debug lines were captured, so their absence of secrets means something
    assert_clean("the log", logged)
    assert CONTENT not in logged  # content stays out of the log unless log_content is on
    files = sorted(tmp_path.glob("store.db*"))
    assert files and b"sum:" in db.read_bytes() + b"".join(f.read_bytes() for f in files)
    for f in files:
        assert_clean(f.name, f.read_bytes())


@pytest.mark.redis
async def test_no_secret_in_redis(upstream, make_proxy, redis_server: RedisServer):
    import redis

    proxy = await make_proxy(upstream.base_url, settings(redis_server.url))
    answers = await scenario(proxy.base_url, upstream)
    check_answers_and_upstream(answers, upstream)
    conn = redis.Redis.from_url(redis_server.url)
    dump = []
    for key in conn.scan_iter(count=1000):
        dump.append(key)
        kind = conn.type(key)
        if kind == b"string":
            dump.append(conn.get(key) or b"")
        elif kind == b"hash":
            dump += [b for kv in conn.hgetall(key).items() for b in kv]
        elif kind == b"zset":
            dump += [m for m, _ in conn.zrange(key, 0, -1, withscores=True)]
    conn.close()
    assert any(b"sum:" in k for k in dump) and any(b"note:" in k for k in dump)
    assert_clean("redis", b"\n".join(dump))


async def test_message_content_is_logged_only_when_turned_on(upstream, make_proxy, caplog):
    caplog.set_level(logging.DEBUG)
    for log_content in (False, True):
        caplog.clear()
        proxy = await make_proxy(upstream.base_url, settings("memory://", log_content=log_content))
        await post(proxy, orjson.dumps({"model": MODEL, "messages": _tool_conversation()}), auth(CLIENT_KEY), expect=200)
        logged = "\n".join(r.getMessage() for r in caplog.records)
        assert (CONTENT in logged) is log_content
        assert_clean("the log", logged)


def test_no_secret_in_a_real_process_log(tmp_path):
    """The console script at DEBUG, its own stderr: start-up, requests, errors, shutdown."""
    import asyncio

    with FakeUpstream() as fake:
        replica = Replica(tmp_path, "secrets", fake.base_url, f"sqlite:///{tmp_path / 'p.db'}", settings("memory://"))
        replica.start()
        try:
            replica.wait_ready()
            answers = asyncio.run(scenario(replica.base_url, fake))
        finally:
            replica.stop()
        assert replica.proc is not None and replica.proc.returncode == 0
        check_answers_and_upstream(answers, fake)
    log = replica.log_text()
    assert "DEBUG" in log and "listening on" in log
    assert_clean("the process log", log)
    assert CONTENT not in log
    assert_clean("the SQLite file", b"".join(p.read_bytes() for p in tmp_path.glob("p.db*")))


def test_needles_find_what_they_look_for() -> None:
    """The checks above can fail: each planted form is found where it is."""
    for n in needles():
        with pytest.raises(AssertionError):
            assert_clean("a planted value", b"prefix " + n + b" suffix")
