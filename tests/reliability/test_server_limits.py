"""The server's own limits on the real process (issue 19 item 5): idle connections, slow headers,
slow bodies on every route and too many connections are each cut at their limit, with small
configured limits so that the test is fast. Before these, 1,000 silent connections and 200
slowloris clients were all still open after 70 s (1,182 descriptors), and a slow body on a
pass-through route was never cut.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator

import orjson
import pytest
import urllib.error
import urllib.request

from proxy.fakes.chat import FakeUpstream
from support.replicas import Replica
from support.waiting import until_sync

HEADER_S = 1.0
IDLE_S = 3.0
BODY_S = 1.0
CAP = 20
SLACK_S = 1.5  # scheduling on a loaded 2-core machine


@pytest.fixture(scope="module")
def proxy(tmp_path_factory) -> Iterator[Replica]:
    tmp = tmp_path_factory.mktemp("limits")
    with FakeUpstream() as fake:
        replica = Replica(tmp, "limits", fake.base_url, "memory://", {"server": {
            "header_timeout_s": HEADER_S, "keepalive_timeout_s": IDLE_S, "body_timeout_s": BODY_S,
            "body_min_kb_s": 64, "max_connections": CAP}})
        replica.start()
        replica.wait_ready()
        try:
            yield replica
        finally:
            replica.stop()


def connect(replica: Replica) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", replica.port), timeout=30)
    return s


def until_closed(s: socket.socket, timeout: float = 30) -> tuple[float, bytes]:
    """Seconds until the server closes `s`, and what it sent before."""
    t0 = time.monotonic()
    s.settimeout(timeout)
    got = b""
    try:
        while chunk := s.recv(65536):
            got += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return time.monotonic() - t0, got


def open_fds(replica: Replica) -> int:
    assert replica.proc is not None
    return len(os.listdir(f"/proc/{replica.proc.pid}/fd"))


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0


def test_idle_connections_are_closed_at_the_keepalive_timeout(proxy):
    before = open_fds(proxy)
    socks = [connect(proxy) for _ in range(CAP - 2)]
    t0 = time.monotonic()
    for s in socks:
        until_closed(s, IDLE_S + 10)
        s.close()
    took = time.monotonic() - t0
    assert IDLE_S - 0.5 <= took <= IDLE_S + SLACK_S, took
    time.sleep(0.2)
    assert open_fds(proxy) <= before + 1


def test_a_slowloris_client_is_cut_at_the_header_timeout_with_a_408(proxy):
    s = connect(proxy)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    t0 = time.monotonic()
    answer = b""
    s.settimeout(0.25)
    try:
        for i in range(200):  # one header line every 0.25 s, never the blank line
            s.sendall(f"X-Drip-{i}: x\r\n".encode())
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                continue
            answer += chunk
            if not chunk:
                break
    except (BrokenPipeError, ConnectionResetError):
        pass
    took = time.monotonic() - t0
    s.close()
    assert status_of(answer) == 408 and b"request_timeout" in answer, answer[:200]
    assert HEADER_S - 0.3 <= took <= HEADER_S + SLACK_S, took


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"])
def test_a_slow_body_is_cut_at_its_deadline_on_every_route(proxy, path):
    s = connect(proxy)
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Authorization: Bearer sk-test\r\nContent-Length: 100000\r\n\r\n".encode())
    t0 = time.monotonic()
    answer = b""
    s.settimeout(0.2)
    try:
        for _ in range(200):
            s.sendall(b"          ")  # 10 bytes every 0.2 s
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                continue
            answer += chunk
            if not chunk or b"\r\n\r\n" in answer:
                break
    except (BrokenPipeError, ConnectionResetError):
        pass
    took = time.monotonic() - t0
    s.close()
    assert status_of(answer) == 408, answer[:300]
    assert BODY_S - 0.3 <= took <= BODY_S + SLACK_S, took


@pytest.mark.parametrize("path, body", [
    ("/v1/embeddings", {"model": "text-embedding-3-small", "input": "x" * (640 * 1024)}),
    # read whole before its parse (body.read_raw_body: its one timer goes off at body_timeout_s
    # and is set again at the deadline the bytes since have moved)
    ("/v1/chat/completions", {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x" * (640 * 1024)}]}),
], ids=["pass-through", "chat"])
def test_a_large_upload_at_a_steady_rate_passes_the_body_deadline(proxy, path, body):
    """A rate floor, not a total: 640 KiB at about 256 KiB/s takes 2.5 s, over body_timeout_s."""
    payload = orjson.dumps(body)
    s = connect(proxy)
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Authorization: Bearer sk-test\r\nContent-Length: {len(payload)}\r\n\r\n".encode())
    t0 = time.monotonic()
    step = 32 * 1024
    for i in range(0, len(payload), step):
        s.sendall(payload[i:i + step])
        time.sleep(step / (256 * 1024))
    sent_in = time.monotonic() - t0
    _, answer = until_closed_or_answered(s)
    s.close()
    assert sent_in > BODY_S * 2
    assert status_of(answer) == 200, answer[:300]


def until_closed_or_answered(s: socket.socket) -> tuple[float, bytes]:
    s.settimeout(30)
    got = b""
    t0 = time.monotonic()
    while b"\r\n\r\n" not in got and (chunk := s.recv(65536)):
        got += chunk
    return time.monotonic() - t0, got


def test_connections_beyond_the_cap_are_refused_with_a_503_and_the_proxy_recovers(proxy):
    held = [connect(proxy) for _ in range(CAP)]
    time.sleep(0.2)
    extra = connect(proxy)
    took, answer = until_closed(extra, 10)
    extra.close()
    assert status_of(answer) == 503 and b"Retry-After: 1" in answer and b"too_many_connections" in answer, answer
    assert took < 2
    for s in held:
        s.close()
    # Refused (503, or reset) until the proxy has seen the held ones close, however long a loaded machine takes.
    until_sync(lambda: healthz_status(proxy) == 200, "the proxy to take connections again")


def healthz_status(replica: Replica) -> int:
    try:
        with urllib.request.urlopen(replica.root + "/healthz", timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        assert e.code == 503, e.code
        return e.code
    except (urllib.error.URLError, ConnectionError):  # refused before our request was read: a reset
        return 0
