"""Fixtures for the end-to-end suite: real llama.cpp upstreams and the real proxy as a subprocess.

Run with:  pytest -m e2e -o addopts='' tests/e2e
Needs the e2e venv (scripts/e2e-upstream install). Without it the suite is skipped, unless the
environment variable CI is set, in which case it fails.

Fixtures
  llama_server        session; SmolLM2 on 127.0.0.1:$E2E_PORT (8788), n_ctx 8192
  llama_server_small  session; same model on 127.0.0.1:$E2E_SMALL_PORT (8789), n_ctx 2048
  litellm_server      session; LiteLLM's proxy on 127.0.0.1:$E2E_LITELLM_PORT (8790) speaking
                      Anthropic Messages and OpenAI Responses, bridged to llama_server's chat
                      (needs scripts/e2e-upstream install-litellm; skipped without, failed under CI)
  claude_code, codex, gemini_cli
                      session; the path of the real Claude Code / Codex / Gemini CLI's executable
                      (needs scripts/e2e-upstream install-claude-code / install-codex /
                      install-gemini-cli; skipped without, failed under CI)
  start_proxy         factory; start_proxy(llama=None, **config_overrides) -> Proxy
  tap                 factory; tap(server) -> Tap, a recording pass-through to that server (tap.py):
                      start_proxy(llama, upstream={"base_url": t.base_url}) puts it in between
                      (for LiteLLM's Messages side: anthropic={"base_url": t.url})
A server already started by hand with scripts/e2e-upstream on the same port is reused and left
running at the end.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from .tap import Tap

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "e2e-upstream"
MODEL = os.environ.get("E2E_MODEL", "smollm2")


def _client(base_url: str, **kw: Any):
    import openai

    kw.setdefault("api_key", "e2e-not-checked")
    kw.setdefault("max_retries", 0)
    kw.setdefault("timeout", 120)
    return openai.OpenAI(base_url=base_url, **kw)


@dataclass
class Upstream:
    port: int
    n_ctx: int
    model: str = MODEL

    @property
    def base_url(self) -> str:  # what an OpenAI client (or the proxy's upstream.base_url) wants
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def log_path(self) -> Path:
        return ROOT / ".e2e" / f"server-{self.port}.log"

    def client(self, **kw: Any):
        return _client(self.base_url, **kw)


@dataclass
class LiteLLM:
    port: int
    upstream: Upstream  # the llama server it bridges to
    key: str = "sk-e2e-litellm-master"  # its master key (scripts/e2e-upstream); the clients send it

    @property
    def model(self) -> str:
        return self.upstream.model

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return ROOT / ".e2e" / f"litellm-{self.port}.log"


@dataclass
class Proxy:
    port: int
    process: subprocess.Popen
    config: dict[str, Any]
    config_path: Path
    log_path: Path
    returncode: int | None = field(default=None)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def client(self, **kw: Any):
        return _client(self.base_url, **kw)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, wait, SIGKILL if needed. Returns the exit code (idempotent)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.returncode = self.process.returncode
        return self.returncode


def _script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT)


@pytest.fixture(scope="session", autouse=True)
def _e2e_venv_required() -> None:
    if _script("model-path").returncode == 0:
        return
    reason = "e2e venv not installed (run scripts/e2e-upstream install; first build takes ~5 min)"
    if os.environ.get("CI"):
        pytest.fail(reason + " -- CI is set, so this is an error", pytrace=False)
    pytest.skip(reason)


def _llama(port: int, n_ctx: int):
    already = (ROOT / ".e2e" / f"server-{port}.pid").exists()
    r = _script("start", "--port", str(port), "--n-ctx", str(n_ctx), "--alias", MODEL)
    if r.returncode != 0:
        pytest.fail(f"llama server on port {port} did not start:\n{r.stdout}{r.stderr}", pytrace=False)
    reused = already and r.stdout.startswith("already running")
    yield Upstream(port=port, n_ctx=n_ctx)
    if not reused:
        _script("stop", "--port", str(port))


@pytest.fixture(scope="session")
def llama_server():
    yield from _llama(int(os.environ.get("E2E_PORT", 8788)), 8192)


@pytest.fixture(scope="session")
def llama_server_small():
    yield from _llama(int(os.environ.get("E2E_SMALL_PORT", 8789)), 2048)


@pytest.fixture(scope="session")
def litellm_server(llama_server):
    if _script("litellm-path").returncode != 0:
        reason = "LiteLLM venv not installed (run scripts/e2e-upstream install-litellm)"
        if os.environ.get("CI"):
            pytest.fail(reason + " -- CI is set, so this is an error", pytrace=False)
        pytest.skip(reason)
    port = int(os.environ.get("E2E_LITELLM_PORT", 8790))
    already = (ROOT / ".e2e" / f"litellm-{port}.pid").exists()
    started = time.monotonic()
    r = _script("start-litellm", "--port", str(port), "--llama-port", str(llama_server.port),
                "--alias", llama_server.model)
    if r.returncode != 0:
        pytest.fail(f"LiteLLM on port {port} did not start:\n{r.stdout}{r.stderr}", pytrace=False)
    print(f"\nLiteLLM ready in {time.monotonic() - started:.1f} s")
    reused = already and r.stdout.startswith("LiteLLM already running")
    yield LiteLLM(port=port, upstream=llama_server)
    if not reused:
        _script("stop-litellm", "--port", str(port))


def _agent(command: str, name: str) -> Path:
    r = _script(f"{command}-path")
    if r.returncode != 0:
        reason = f"{name} not installed (run scripts/e2e-upstream install-{command})"
        if os.environ.get("CI"):
            pytest.fail(reason + " -- CI is set, so this is an error", pytrace=False)
        pytest.skip(reason)
    return Path(r.stdout.strip())


@pytest.fixture(scope="session")
def claude_code() -> Path:
    """The real Claude Code CLI (scripts/e2e-upstream install-claude-code; skipped without, failed
    under CI): the path of its `claude` executable."""
    return _agent("claude-code", "Claude Code")


@pytest.fixture(scope="session")
def codex() -> Path:
    """The real Codex CLI (scripts/e2e-upstream install-codex; skipped without, failed under CI):
    the path of its `codex` executable."""
    return _agent("codex", "Codex")


@pytest.fixture(scope="session")
def gemini_cli() -> Path:
    """The real Gemini CLI (scripts/e2e-upstream install-gemini-cli; skipped without, failed under
    CI): the path of its `gemini` executable."""
    return _agent("gemini-cli", "Gemini CLI")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _unflatten(overrides: dict[str, Any]) -> dict[str, Any]:
    """{'compaction__threshold_tokens': 900} -> {'compaction': {'threshold_tokens': 900}}."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        for part in reversed(key.split("__")):
            value = {part: value}
        out = _merge(out, value)
    return out


def _wait_healthy(proxy: Proxy, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proxy.process.poll() is not None:
            pytest.fail(f"proxy exited with {proxy.process.returncode} during startup:\n"
                        f"{proxy.log_text()[-3000:]}", pytrace=False)
        try:
            with urllib.request.urlopen(f"{proxy.url}/healthz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    proxy.stop()
    pytest.fail(f"proxy not healthy after {timeout}s:\n{proxy.log_text()[-3000:]}", pytrace=False)


@pytest.fixture
def start_proxy(request, tmp_path):
    """Factory: start_proxy(llama=None, **config_overrides) -> Proxy.

    Starts `python -m proxy --config FILE --host 127.0.0.1 --port FREE` from the repo root with the
    interpreter running pytest. config_overrides are config sections as nested dicts
    (compaction={"threshold_tokens": 900}) or flattened keys (compaction__threshold_tokens=900).
    Defaults: upstream.base_url = the llama server (`llama`, else llama_server), its model's
    context_window = that server's n_ctx, a fresh sqlite store in tmp_path, shutdown_grace_s 5.
    COMPACTION_PROXY_* variables from the outer environment are not passed on.
    Every proxy started is SIGTERMed at teardown; proxy.stop() does it earlier and returns the code.
    """
    started: list[Proxy] = []

    def start(llama: Upstream | None = None, **config_overrides: Any) -> Proxy:
        overrides = _unflatten(config_overrides)
        n = len(started)
        config: dict[str, Any] = {
            "server": {"shutdown_grace_s": 5, "log_level": "debug"},
            "store": {"url": f"sqlite:///{tmp_path}/proxy-{n}.db"},
        }
        if llama is None and "base_url" not in overrides.get("upstream", {}):
            llama = request.getfixturevalue("llama_server")
        if llama is not None:
            config["upstream"] = {"base_url": llama.base_url}
            config["models"] = {llama.model: {"context_window": llama.n_ctx}}
        config = _merge(config, overrides)
        config_path = tmp_path / f"proxy-{n}.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        log_path = tmp_path / f"proxy-{n}.log"
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_PROXY_")}
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "proxy", "--config", str(config_path),
                 "--host", "127.0.0.1", "--port", str(port)],
                cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
        proxy = Proxy(port=port, process=process, config=config, config_path=config_path,
                      log_path=log_path)
        started.append(proxy)
        _wait_healthy(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()


@pytest.fixture
def tap():
    """Factory: tap(server) -> a started Tap relaying to that server (an Upstream or LiteLLM); all
    are stopped at teardown."""
    started: list[Tap] = []

    def start(server: Upstream | LiteLLM) -> Tap:
        t = Tap(f"http://127.0.0.1:{server.port}").start()
        started.append(t)
        return t

    yield start
    for t in started:
        t.stop()
