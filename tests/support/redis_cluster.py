"""A real, throwaway Redis Cluster for tests: three `redis-server` primaries on loopback.

    with RedisCluster() as cluster:    # created with redis-cli --cluster create, state ok
        use(cluster.url)               # redis+cluster://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3/
        cluster.nodes[1].stop(); cluster.nodes[1].start()   # one node down, then back

Each node is a RedisServer (tests/support/redis_server.py) started with cluster mode and its own
nodes.conf in its temp dir, so a node that restarts comes back with its slots (its data is gone:
no persistence). `cluster-node-timeout` is short so that the cluster notices a dead node within a
second, not fifteen. Fixtures: `redis_cluster` (one cluster per session);
`redis_cluster_fixture(name, scope)` makes more, e.g. a module's own for a test that kills a node.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

import pytest

from support.redis_server import RedisServer, _free_port, start_redis_or_skip

NODE_TIMEOUT_MS = 1000
_READY_TIMEOUT_S = 30.0
CLUSTER_ARGS = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(NODE_TIMEOUT_MS))


class RedisCluster:
    def __init__(self, size: int = 3) -> None:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise FileNotFoundError("redis-cli not found on PATH")
        self.cli = cli
        self.nodes: list[RedisServer] = []
        try:
            for _ in range(size):
                # The bus port named: by default it is the port + 10000, maybe taken or past 65535.
                self.nodes.append(RedisServer(extra_args=(*CLUSTER_ARGS, "--cluster-port", str(_free_port()))))
            self._create()
            self.wait_ok()
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes) + "/"

    def _create(self) -> None:
        addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run([self.cli, "--cluster", "create", *addrs, "--cluster-replicas", "0", "--cluster-yes"],
                       check=True, capture_output=True, timeout=_READY_TIMEOUT_S)

    def info(self, node: RedisServer) -> str:
        run = subprocess.run([self.cli, "-p", str(node.port), "cluster", "info"],
                             capture_output=True, timeout=5, text=True)
        return run.stdout

    def wait_ok(self) -> None:
        """Until every node says cluster_state:ok (all slots served, every node known)."""
        self.wait_state("ok", self.nodes)

    def wait_state(self, state: str, nodes: list[RedisServer]) -> None:
        """Until each of `nodes` says cluster_state:<state> (`fail`: they noticed a dead node)."""
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while not all(f"cluster_state:{state}" in self.info(n) for n in nodes):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the test cluster did not reach cluster_state:{state}")
            time.sleep(0.05)

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def __enter__(self) -> RedisCluster:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def redis_cluster_fixture(name: str, scope: Any = "session") -> Callable[..., Any]:
    """A pytest fixture called `name` yielding a RedisCluster, closed when its scope ends; skipped
    (failed under CI) without redis-server."""

    @pytest.fixture(name=name, scope=scope)
    def _fixture() -> Iterator[RedisCluster]:
        start_redis_or_skip().close()
        with RedisCluster() as cluster:
            yield cluster

    return _fixture


redis_cluster = redis_cluster_fixture("redis_cluster")
