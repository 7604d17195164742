"""SIGTERM on the real process (`python -m proxy`, issue 7 item 1): new connections are refused at
once, requests in flight get `server.shutdown_grace_s` to finish, the process exits 0 as soon as
none is left (or when the grace runs out, cutting what is still running), and the SQLite store is
left consistent.

The fake upstream runs in its own thread (the proxy process calls it), so this test's loop only
drives the client side.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from support.compaction_helpers import chat_history
from proxy.fakes.chat import FakeUpstream
from proxy.serve import CANCEL_WAIT_S, drain
from support.replicas import Replica
from support.waiting import until

MODEL = "gpt-4"
BOUND_S = 30
AUTH = {"Authorization": "Bearer sk-test-key"}  # an anonymous request is not compacted
STREAM = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "a long story"}], "stream": True})


@pytest.fixture
def fake() -> Iterator[FakeUpstream]:
    with FakeUpstream(reply="Once upon a time, " * 20) as f:
        yield f


def _start(tmp_path: Path, fake: FakeUpstream, grace_s: float) -> tuple[Replica, Path]:
    db = tmp_path / "store.db"
    settings = {
        "server": {"shutdown_grace_s": grace_s},
        "models": {MODEL: {"context_window": 6000}},
        "compaction": {"prepare_percent": 0},
    }
    replica = Replica(tmp_path, "proxy", fake.base_url, f"sqlite:///{db}", settings)
    replica.start()
    replica.wait_ready()
    return replica, db


def _park_streams(fake: FakeUpstream) -> asyncio.Event:
    """Streams stop before their final chunk until the returned event is set (from any thread)."""
    release = asyncio.Event()
    fake.release_last_chunk = release
    fake.last_chunk_waiting = asyncio.Event()
    return release


def _refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    except ConnectionResetError:
        # A connect that met the listener as it closed (queued, then reset): not yet a refusal; look again.
        return False
    return False


async def _exit_code(replica: Replica) -> int:
    assert replica.proc is not None
    return await asyncio.to_thread(replica.proc.wait, BOUND_S)


def _consistent(db: Path) -> int:
    """Runs SQLite's own check on the file; returns how many records it holds."""
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        (count,) = conn.execute("SELECT count(*) FROM kv").fetchone()
    return count


async def _compact(session: aiohttp.ClientSession, replica: Replica) -> None:
    """A request that stores a summary, so that the file holds records written by this process."""
    body = orjson.dumps({"model": MODEL, "messages": chat_history(12, 150)})
    async with session.post(replica.base_url + "/chat/completions", data=body) as r:
        assert r.status == 200 and r.headers["x-compaction-status"] == "summarized"


async def test_sigterm_refuses_new_connections_and_lets_a_stream_finish(tmp_path, fake):
    replica, db = _start(tmp_path, fake, grace_s=BOUND_S)
    try:
        async with aiohttp.ClientSession(headers=AUTH) as s:
            await _compact(s, replica)
            release = _park_streams(fake)
            async with s.post(replica.base_url + "/chat/completions", data=STREAM) as r:
                first = await asyncio.wait_for(r.content.readuntil(b"\n\n"), BOUND_S)
                await until(fake.last_chunk_waiting.is_set, "the stream to park")
                replica.proc.send_signal(signal.SIGTERM)
                await until(lambda: _refuses(replica.port), "new connections to be refused")
                assert replica.proc.poll() is None  # still serving the stream in flight
                fake.loop.call_soon_threadsafe(release.set)
                rest = await asyncio.wait_for(r.read(), BOUND_S)
                ended = time.monotonic()
        assert first.startswith(b"data: {") and rest.endswith(b"data: [DONE]\n\n")
        assert await _exit_code(replica) == 0
        assert time.monotonic() - ended < BOUND_S / 2  # once idle it exits, long before the grace ends
    finally:
        replica.kill()
    log = replica.log_text()
    assert "Traceback" not in log
    # the stop and the end of the draining are each one line, in that order
    told, drained = log.find("SIGTERM received: no new connections; draining 1 requests in flight"), log.find("drained:")
    assert 0 <= told < drained, log[-2000:]
    assert _consistent(db) >= 2  # the scope secret and the summary


async def test_a_stream_longer_than_the_grace_is_cut_and_the_process_still_exits_0(tmp_path, fake):
    grace = 0.5
    replica, db = _start(tmp_path, fake, grace_s=grace)
    try:
        async with aiohttp.ClientSession(headers=AUTH) as s:
            await _compact(s, replica)
            _park_streams(fake)  # never released
            fake.summarizer_delay_s = 3600  # and a compaction whose summary never comes
            slow = asyncio.create_task(s.post(replica.base_url + "/chat/completions", data=orjson.dumps(
                {"model": MODEL, "messages": chat_history(12, 160)})))  # not a prefix of the first
            async with s.post(replica.base_url + "/chat/completions", data=STREAM) as r:
                await asyncio.wait_for(r.content.readuntil(b"\n\n"), BOUND_S)
                await until(fake.last_chunk_waiting.is_set, "the stream to park")
                await until(lambda: len(fake.summarizer_requests) == 2, "the second summary to start")
                replica.proc.send_signal(signal.SIGTERM)
                signalled = time.monotonic()
                await until(lambda: _refuses(replica.port), "new connections to be refused")
                with pytest.raises(aiohttp.ClientPayloadError):
                    await asyncio.wait_for(r.read(), BOUND_S)  # cut: the body never completes
            with pytest.raises(aiohttp.ClientError):
                await asyncio.wait_for(slow, BOUND_S)
        assert await _exit_code(replica) == 0
        assert time.monotonic() - signalled < grace + 10  # promptly after the grace, not after the stream
    finally:
        replica.kill()
    assert "Traceback" not in replica.log_text()
    assert "SIGTERM received" in replica.log_text() and "shutdown grace over: cut 2 requests" in replica.log_text()
    assert _consistent(db) >= 2


def test_a_taken_port_is_one_line_and_status_1(tmp_path):
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = subprocess.run([sys.executable, "-m", "proxy", "--port", str(port), "--upstream", "http://127.0.0.1:9/v1"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=60,
                             env={**os.environ, "COMPACTION_PROXY_STORE__URL": "memory://"})
    assert run.returncode == 1
    assert "Traceback" not in run.stderr
    assert f"compaction-proxy: cannot listen on 127.0.0.1:{port}: " in run.stderr


async def test_a_grace_of_2_s_cuts_a_stream_after_2_s_not_twice_that(tmp_path, fake):
    """aiohttp waits its shutdown timeout twice (for the handler, then again after asking it to
    stop, which a streaming relay never notices): a grace of 5 s cut streams after 10.4 s."""
    grace = 2.0
    replica, _ = _start(tmp_path, fake, grace_s=grace)
    try:
        async with aiohttp.ClientSession(headers=AUTH) as s:
            _park_streams(fake)  # never released
            async with s.post(replica.base_url + "/chat/completions", data=STREAM) as r:
                await asyncio.wait_for(r.content.readuntil(b"\n\n"), BOUND_S)
                await until(fake.last_chunk_waiting.is_set, "the stream to park")
                replica.proc.send_signal(signal.SIGTERM)
                signalled = time.monotonic()
                with pytest.raises(aiohttp.ClientPayloadError):
                    await asyncio.wait_for(r.read(), BOUND_S)
                cut = time.monotonic() - signalled
        assert await _exit_code(replica) == 0
        exited = time.monotonic() - signalled
    finally:
        replica.kill()
    assert grace - 0.2 <= cut < grace + 1.0, cut  # the grace, once
    # Then the process goes: the cancelled relay gets CANCEL_WAIT_S to unwind and the runner's
    # cleanup as long again, the bounds serve.py sets. On a loaded machine the unwinding can take
    # all of its time (the test's own upstream, in this process, answers slowly), so the exit is
    # held to those bounds rather than to an idle machine's timing.
    assert exited - cut < 2 * CANCEL_WAIT_S + 1.0, (cut, exited)


# -- the drain itself, without a process: its tasks are the in-flight set serve() hands it --------
async def test_a_handler_that_starts_during_the_grace_gets_the_grace_too() -> None:
    """A request read before the listener closed can start its handler after the wait began; it is
    waited for like the others (looked at once, the set would miss it and it would be cut by the
    cleanup's CANCEL_WAIT_S, long before the grace ends)."""
    inflight: set[asyncio.Task[None]] = set()
    early = asyncio.create_task(asyncio.sleep(0.2))
    inflight.add(early)
    late = asyncio.create_task(asyncio.sleep(0.6))

    async def arrives() -> None:
        await asyncio.sleep(0.1)  # while drain waits for `early`
        inflight.add(late)

    joining = asyncio.create_task(arrives())
    cut = await drain(inflight, grace_s=30)
    await joining
    assert cut == 0
    assert late.done() and not late.cancelled()  # finished within the grace, not left running


async def test_what_outlives_the_grace_is_cut_at_its_end_late_arrivals_included() -> None:
    inflight: set[asyncio.Task[None]] = set()
    slow = asyncio.create_task(asyncio.sleep(60))
    inflight.add(slow)
    late = asyncio.create_task(asyncio.sleep(60))
    loop = asyncio.get_running_loop()
    loop.call_later(0.1, inflight.add, late)
    started = time.monotonic()
    cut = await drain(inflight, grace_s=0.5)
    took = time.monotonic() - started
    assert cut == 2 and slow.cancelled() and late.cancelled()
    assert 0.5 <= took < 0.5 + CANCEL_WAIT_S, took  # the grace once, in all: not a grace per arrival


async def test_nothing_in_flight_drains_at_once() -> None:
    done = asyncio.create_task(asyncio.sleep(0))
    await done
    started = time.monotonic()
    assert await drain({done}, grace_s=30) == 0
    assert time.monotonic() - started < 1
