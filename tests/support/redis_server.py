"""A real, throwaway redis-server for tests (design.md § How it is tested: storage in tests is real).

    with RedisServer() as server:      # started, answers PING
        use(server.url)
        server.stop(); server.start()  # an outage, then the same server back on the same port

Fixtures: `redis_server` (one server per session) is ready to import into a test module or a
conftest; `redis_server_fixture(name, scope)` makes more, e.g. a private server per test for
tests that stop it. Without a redis-server binary the tests using them are skipped, or fail when
the environment variable CI is set (CI must not silently skip them).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

_START_TIMEOUT_S = 30.0  # a loaded CI machine can take seconds to start a process


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """redis-server on 127.0.0.1 at a free port, without persistence, in its own temp dir."""

    def __init__(self, binary: str | None = None, extra_args: tuple[str, ...] = ()) -> None:
        found = binary or shutil.which("redis-server")
        if found is None:
            raise FileNotFoundError("redis-server not found on PATH")
        self.binary = found
        self.port = _free_port()
        self.extra_args = extra_args  # e.g. cluster mode (tests/support/redis_cluster.py)
        self._dir = Path(tempfile.mkdtemp(prefix="redis-test-"))
        self._log = self._dir / "redis.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start (or restart after stop()) on the same port; returns once it answers PING."""
        if self._proc is not None:
            return
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--daemonize", "no", *self.extra_args]
        with open(self._log, "ab") as log:
            self._proc = subprocess.Popen(args, cwd=self._dir, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not _answers_ping(self.port):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self._log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server on port {self.port} did not start:\n{tail}")
            time.sleep(0.02)

    def stop(self, *, kill: bool = False) -> None:
        """Shut down (SIGTERM), or with `kill` die at once (SIGKILL), as a crashed node does."""
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        proc.kill() if kill else proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def start_redis_or_skip() -> RedisServer:
    """A running server; without the binary, skip the test (fail it when CI is set)."""
    try:
        return RedisServer()
    except FileNotFoundError:
        message = "redis-server is not installed (Debian/Ubuntu: apt-get install redis-server)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI is set, so Redis tests must not be skipped")
        pytest.skip(message)


def redis_server_fixture(name: str, scope: Any = "function") -> Callable[..., Any]:
    """A pytest fixture called `name` yielding a RedisServer, closed when its scope ends."""

    @pytest.fixture(name=name, scope=scope)
    def _fixture() -> Iterator[RedisServer]:
        server = start_redis_or_skip()
        try:
            yield server
        finally:
            server.close()

    return _fixture


redis_server = redis_server_fixture("redis_server", scope="session")
