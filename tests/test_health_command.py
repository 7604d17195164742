"""`compaction-proxy health`: a running proxy's /healthz at the address its own config gives,
whichever way the port was set (flag, file, environment): the container's HEALTHCHECK
(`health --pid 1`) reads the serving process's arguments, environment and working directory.
Real proxy processes, the real command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.operator.health import healthz_url, serve_argv
from proxy.config import load_config
from support.loopback import accepts
from support.replicas import _free_port
from support.waiting import until_sync

ROOT = Path(__file__).resolve().parents[1]


def serve(tmp_path: Path, args: list[str], **env: str) -> subprocess.Popen[bytes]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_PROXY_")}
    full.update(PYTHONPATH=str(ROOT), COMPACTION_PROXY_STORE__URL="memory://", **env)
    return subprocess.Popen([sys.executable, "-m", "proxy", *args], cwd=tmp_path, env=full,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def health(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_PROXY_")}
    full.update(PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-m", "proxy", "health", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("how", ["flag", "file", "env"])
def test_health_of_the_serving_process_follows_its_port(tmp_path, how):
    port = _free_port()
    (tmp_path / "proxy.yaml").write_text(f"server:\n  port: {port}\n" if how == "file" else "{}\n")
    args = ["--config", "proxy.yaml"] + (["--port", str(port)] if how == "flag" else [])
    proc = serve(tmp_path, args, **({"COMPACTION_PROXY_SERVER__PORT": str(port)} if how == "env" else {}))
    try:
        until_sync(lambda: accepts(port), "the proxy to listen")
        elsewhere = tmp_path / "elsewhere"  # the check runs in its own directory, without the variable
        elsewhere.mkdir()
        r = health("--pid", str(proc.pid), cwd=elsewhere)
        assert (r.returncode, r.stderr) == (0, "")
    finally:
        proc.terminate()
        proc.wait(30)
    r = health("--pid", str(proc.pid), cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.startswith("compaction-proxy health: cannot read process")


def test_health_with_flags_and_a_proxy_that_is_gone(tmp_path):
    port = _free_port()
    proc = serve(tmp_path, ["--port", str(port)])
    try:
        until_sync(lambda: accepts(port), "the proxy to listen")
        assert health("--port", str(port), cwd=tmp_path).returncode == 0
    finally:
        proc.terminate()
        proc.wait(30)
    r = health("--port", str(port), cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.startswith(f"compaction-proxy health: http://127.0.0.1:{port}/healthz: ")
    assert len(r.stderr.strip().splitlines()) == 1
    r = health(cwd=tmp_path, COMPACTION_PROXY_SERVR__PORT="1")
    assert r.returncode == 2 and "COMPACTION_PROXY_SERVR__PORT: unknown variable" in r.stderr


def test_the_proxy_arguments_in_a_command_line():
    assert serve_argv(["/usr/local/bin/python", "/usr/local/bin/compaction-proxy", "--host", "0.0.0.0"]) == \
        ["--host", "0.0.0.0"]
    assert serve_argv(["compaction-proxy", "--port", "9"]) == ["--port", "9"]
    assert serve_argv(["python3", "-m", "proxy", "--config", "c.yaml"]) == ["--config", "c.yaml"]
    assert serve_argv(["nginx", "-g", "daemon off;"]) == []


def test_any_address_is_checked_on_loopback():
    assert healthz_url(load_config(environ={}, overrides={"server": {"host": "0.0.0.0", "port": 9}})) == \
        "http://127.0.0.1:9/healthz"
    assert healthz_url(load_config(environ={}, overrides={"server": {"host": "::", "port": 9}})) == "http://[::1]:9/healthz"
    assert healthz_url(load_config(environ={}, overrides={"server": {"host": "10.0.0.5", "port": 9}})) == \
        "http://10.0.0.5:9/healthz"
