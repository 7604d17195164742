"""`server.workers: 2` on one SQLite file (issue 18): one port, two processes, one summary.

The proxy is the real console script (`python -m proxy`) with two workers; the fake upstream runs
in a thread. Which worker answers is the kernel's choice (SO_REUSEPORT spreads connections), so
every request here opens a connection of its own and the access log's `worker` field says who
answered.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import struct
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.fakes.chat import FakeUpstream
from support.conversations import MODEL, WINDOW, send, synthetic
from support.replicas import Replica
from support.waiting import until

SETTINGS = {
    "server": {"workers": 2, "log_format": "json", "shutdown_grace_s": 10},
    "models": {MODEL: {"context_window": WINDOW}},
    "compaction": {"prepare_percent": 0, "learn_token_ratio": False},
}


@pytest.fixture
def fake() -> Iterator[FakeUpstream]:
    with FakeUpstream(window=WINDOW) as f:
        yield f


@pytest.fixture
def proxy(tmp_path: Path, fake: FakeUpstream) -> Iterator[Replica]:
    p = Replica(tmp_path, "workers", fake.base_url, f"sqlite:///{tmp_path / 'store.db'}", SETTINGS)
    p.start()
    try:
        p.wait_ready()
        yield p
    finally:
        p.stop()


def children(pid: int) -> set[int]:
    """Live processes whose parent is `pid` (from /proc)."""
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                out.add(int(entry))
    return out


def access_lines(p: Replica, path: str) -> list[dict]:
    lines = [json.loads(line) for line in p.log_text().splitlines() if line.startswith("{")]
    return [r for r in lines if r["logger"] == "proxy.access" and r["path"] == path]


def chat_requests_total(p: Replica) -> float:
    with urllib.request.urlopen(p.root + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    # the states read at scrape time appear once, combined, not once per worker
    assert sum(line.startswith("compaction_proxy_store_up ") for line in text.splitlines()) == 1
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("compaction_proxy_requests_total{") and 'route="/v1/chat/completions"' in line)


async def test_two_workers_share_one_port_one_summary_and_the_metrics(proxy: Replica, fake: FakeUpstream, client_for) -> None:
    assert proxy.proc is not None
    workers = children(proxy.proc.pid)
    assert len(workers) == 2

    fake.summarizer_delay_s = 0.5  # long enough for all ten to arrive meanwhile, on either worker
    messages = synthetic("two workers")
    turns = await asyncio.gather(*(send(client_for(proxy), messages) for _ in range(10)))
    assert len(fake.history_summarizer_requests) == 1  # one summary across both processes
    forwarded = [r.body for r in fake.records("chat")]
    assert len(forwarded) == 10 and len(set(forwarded)) == 1 and b"<summary>" in forwarded[0]
    assert {t.status for t in turns} <= {"summarized", "reused"}

    # Both processes answer: a connection each until both showed up (the kernel picks; a line
    # reaches the log file within its batch delay, later on a loaded machine).
    deadline = time.monotonic() + 30
    while {r["worker"] for r in access_lines(proxy, "/healthz") + access_lines(proxy, "/v1/chat/completions")} != workers:
        assert time.monotonic() < deadline, "both workers never showed up in the access log"
        await asyncio.to_thread(urllib.request.urlopen, proxy.root + "/healthz", timeout=30)
        await asyncio.sleep(0.05)
    # Whichever worker answers /metrics counts every worker's requests. A request is counted in its
    # worker's bookkeeping, which runs a moment after its answer (batched, ops/hooks.py): first until
    # all ten are counted, then every answer, from either worker, counts them all.
    while await asyncio.to_thread(chat_requests_total, proxy) != 10.0:
        assert time.monotonic() < deadline, "the workers' metrics never counted the ten requests"
        await asyncio.sleep(0.05)
    counts = {await asyncio.to_thread(chat_requests_total, proxy) for _ in range(8)}
    assert counts == {10.0}
    # access lines are written in batches, within 50 ms (ops/logs.LineHandler)
    await until(lambda: access_lines(proxy, "/metrics"), "a /metrics line in the access log")


async def test_sigterm_drains_and_ends_both_workers(proxy: Replica, fake: FakeUpstream, client_for) -> None:
    assert proxy.proc is not None
    workers = children(proxy.proc.pid)
    assert len(workers) == 2
    fake.summarizer_delay_s = 1.5
    in_flight = asyncio.create_task(send(client_for(proxy), synthetic("drained")))
    await fake.wait_for_requests(1, "summarizer", timeout=30)
    proxy.proc.send_signal(signal.SIGTERM)
    turn = await asyncio.wait_for(in_flight, 30)  # the request in flight is finished, not cut
    assert turn.status == "summarized"
    code = await asyncio.to_thread(proxy.proc.wait, 30)
    assert code == 0
    await until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in workers), "the workers to be gone")
    assert "Traceback" not in proxy.log_text()


def test_sigterm_while_the_workers_start_still_ends_cleanly(tmp_path: Path, fake: FakeUpstream) -> None:
    """A stop that comes before the workers listen (the supervisor has just forked them) waits for
    each to start and drains it: exit 0, not a worker killed halfway through its start."""
    p = Replica(tmp_path, "early-stop", fake.base_url, f"sqlite:///{tmp_path / 'store.db'}", SETTINGS)
    p.start()
    try:
        deadline = time.monotonic() + 30
        while "workers on port" not in p.log_text():
            assert time.monotonic() < deadline and p.proc is not None and p.proc.poll() is None, p.log_text()
            time.sleep(0.005)
        assert p.proc is not None
        workers = children(p.proc.pid)
        p.proc.send_signal(signal.SIGTERM)
        assert p.proc.wait(30) == 0, p.log_text()
    finally:
        p.stop()
    assert len(workers) == 2 and not any(Path(f"/proc/{pid}").exists() for pid in workers)
    assert "exit code" not in p.log_text() and "Traceback" not in p.log_text()


def test_a_metrics_file_another_worker_is_creating_is_not_read(tmp_path: Path, monkeypatch) -> None:
    """prometheus-client creates a worker's file empty, then sizes it: the sum read at that instant
    (a starting worker's first dashboard sample, or /metrics) skips it instead of raising."""
    from prometheus_client import CollectorRegistry, Counter, values
    from prometheus_client.multiprocess import MultiProcessCollector

    from proxy.ops.metrics import _WorkerFiles

    # what share_metrics does in a worker, undone after the test (it would also set proxy.ops.metrics' directory)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue())
    Counter("done", "d", registry=CollectorRegistry()).inc(3)
    (tmp_path / "counter_99999.db").write_bytes(b"")  # another worker's, being created
    with pytest.raises(struct.error):
        list(MultiProcessCollector(None, str(tmp_path)).collect())  # what it read before
    view = CollectorRegistry()
    _WorkerFiles(view, str(tmp_path))
    assert view.get_sample_value("done_total") == 3


def _new_worker(p: Replica, known: set[int], *, may_end: bool = False) -> int | None:
    """The pid of a worker the supervisor started after `known` (waited for); None when the
    supervisor ended meanwhile (`may_end`)."""
    assert p.proc is not None
    deadline = time.monotonic() + 30
    while not (fresh := children(p.proc.pid) - known):
        if may_end and p.proc.poll() is not None:
            return None
        assert time.monotonic() < deadline and p.proc.poll() is None, p.log_text()
        time.sleep(0.005)
    return fresh.pop()


async def test_a_worker_that_dies_early_is_started_again_after_a_back_off(proxy: Replica, client_for) -> None:
    """A worker killed right after its start (as the kernel's OOM killer would) is replaced, after
    a back-off; the proxy goes on serving on the same port."""
    assert proxy.proc is not None
    workers = children(proxy.proc.pid)
    victim = workers.pop()
    os.kill(victim, signal.SIGKILL)
    seen = workers | {victim}
    replacement = await asyncio.to_thread(_new_worker, proxy, seen)
    os.kill(replacement, signal.SIGKILL)  # within its first seconds: an early death
    seen.add(replacement)
    third = await asyncio.to_thread(_new_worker, proxy, seen)
    assert proxy.proc.poll() is None
    await until(lambda: "starting another in 0.5 s" in proxy.log_text(), "the back-off in the log")
    await asyncio.to_thread(proxy.wait_ready)
    turn = await send(client_for(proxy), synthetic("after the restarts"))
    assert turn.status in ("summarized", "none")
    assert third in children(proxy.proc.pid) and "Traceback" not in proxy.log_text()


def test_a_worker_that_keeps_dying_at_its_start_stops_the_supervisor(tmp_path: Path, fake: FakeUpstream) -> None:
    """Every worker killed as soon as it appears (a crash that comes back at once): the slot is
    started again after 0.5, 1, 2 and 4 s, and its fifth early death ends the supervisor (exit 1)."""
    p = Replica(tmp_path, "dying", fake.base_url, f"sqlite:///{tmp_path / 'store.db'}", SETTINGS)
    p.start()
    try:
        p.wait_ready()
        assert p.proc is not None
        seen = children(p.proc.pid)
        pid: int | None = seen.pop()  # one slot's workers die; the other worker lives on
        kills = 0
        while pid is not None:
            assert kills < 6, p.log_text()  # its first may have lived past the grace: not an early death
            os.kill(pid, signal.SIGKILL)
            kills += 1
            seen.add(pid)
            pid = _new_worker(p, seen, may_end=True)
        assert p.proc.wait(60) == 1, p.log_text()
    finally:
        p.stop()
    log = p.log_text()
    assert [f"starting another in {d} s" in log for d in ("0.5", "1", "2", "4")] == [True] * 4
    assert log.count("starting another") == 4 and "5 times in a row: stopping" in log
