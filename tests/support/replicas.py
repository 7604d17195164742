"""Proxy replicas as real processes: the console script's `python -m proxy`, one port each.

    replica = Replica(tmp_path, "a", upstream_url, store_url, {"compaction": {...}})
    replica.start(); replica.wait_ready()
    ... replica.base_url ...
    replica.kill()   # SIGKILL: dies mid-work, releases nothing
    replica.stop()   # SIGTERM, then SIGKILL if it does not exit

Settings go to a YAML config file, the store URL to the environment and the upstream to a flag, so
all three ways of configuring are exercised. Each replica logs to `<dir>/<name>.log`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

# Deadlines for a hang only, so generous: on a loaded 2-core machine a start (imports, a worker's
# fork) and a drain (a worker still starting finishes its start first) take seconds.
_READY_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Replica:
    def __init__(self, workdir: Path, name: str, upstream_url: str, store_url: str, settings: dict[str, Any]) -> None:
        self.name = name
        self.workdir = workdir
        self.upstream_url = upstream_url
        self.store_url = store_url
        self.config_path = workdir / f"{name}.yaml"
        self.log_path = workdir / f"{name}.log"
        self.config_path.write_text(yaml.safe_dump(settings))
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.root + "/v1"

    def start(self) -> None:
        """Launch the process; `wait_ready` waits for it (start several, then wait for each)."""
        self.port = _free_port()
        env = {**os.environ, "COMPACTION_PROXY_STORE__URL": self.store_url}
        args = [sys.executable, "-m", "proxy", "--config", str(self.config_path),
                "--port", str(self.port), "--upstream", self.upstream_url]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, cwd=self.workdir, env=env, stdout=log, stderr=subprocess.STDOUT)

    def wait_ready(self) -> None:
        assert self.proc is not None, "not started"
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"replica {self.name} exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                with urllib.request.urlopen(self.root + "/healthz", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"replica {self.name} did not answer /healthz:\n{self.log_text()}")
            time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextlib.contextmanager
def running_replicas(
    workdir: Path, upstream_url: str, store_url: str, settings: dict[str, Any], names: tuple[str, ...] = ("a", "b")
) -> Iterator[list[Replica]]:
    """Replicas on one store, started together (each start costs seconds), stopped at the end."""
    group = [Replica(workdir, name, upstream_url, store_url, settings) for name in names]
    try:
        for r in group:
            r.start()
        for r in group:
            r.wait_ready()
        yield group
    finally:
        for r in group:
            r.stop()
