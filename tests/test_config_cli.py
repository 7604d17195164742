"""Configuration (file < env < flags, the example file, bad configs) and the installed console script
run as a real process: serves, answers a chat request, stops on SIGTERM with status 0."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic import BaseModel

from proxy.cmdline import flag_overrides, parse_args
from proxy.config import Config, ConfigError, load_config
from proxy.fake_upstream import FakeUpstream
from support.client import sync_openai_client

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "config" / "proxy.example.yaml"
SCRIPT = Path(sys.executable).parent / "compaction-proxy"


# -- load_config -------------------------------------------------------------------------------


def test_defaults_need_no_file():
    cfg = load_config(None, environ={})
    assert (cfg.server.host, cfg.server.port) == ("127.0.0.1", 8787)
    assert cfg.upstream.base_url == "https://api.openai.com/v1"
    assert cfg.upstream.api_key is None
    assert cfg.server.max_body_mb == 64


def test_example_file_loads_and_equals_the_defaults():
    example = load_config(EXAMPLE, environ={})
    defaults = load_config(None, environ={})
    assert example.model_dump(exclude={"models"}) == defaults.model_dump(exclude={"models"})
    # `models.default` is only shown commented out: set, it would replace the built-in table.
    assert example.models == {}


def test_example_file_documents_every_key():
    import yaml

    documented = yaml.safe_load(EXAMPLE.read_text())
    for section, field in Config.model_fields.items():
        if section == "models":
            continue
        model = field.annotation
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            assert section in documented  # a top-level setting (mode)
            continue
        assert set(documented[section]) == set(model.model_fields), section


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "proxy.yaml"
    p.write_text(text)
    return p


def test_precedence_file_env_flags(tmp_path):
    path = _write(tmp_path, """
server: {port: 1111, host: 10.0.0.1, max_body_mb: 5}
upstream: {base_url: "http://file.example/v1/", timeout_s: 11}
compaction: {keep_recent_tokens: 111, enabled: true}
""")
    env = {
        "COMPACTION_PROXY_SERVER__PORT": "2222",
        "COMPACTION_PROXY_UPSTREAM__TIMEOUT_S": "22.5",
        "COMPACTION_PROXY_COMPACTION__ENABLED": "false",
        "COMPACTION_PROXY_TOOL_RESULTS__SKIP_TOOLS": '[read_file, "mcp_*"]',
        "COMPACTION_PROXY_MODELS__DEFAULT__CONTEXT_WINDOW": "200000",
        "COMPACTION_PROXY_UPSTREAM__API_KEY": "12345",  # digits stay a string
        "COMPACTION_PROXY_COMPACTION__FOCUS": "yes",  # so does a YAML-looking word
        "OTHER_PREFIX_SERVER__PORT": "9",
    }
    flags = flag_overrides(parse_args(["--port", "3333", "--upstream", "http://flag.example/v1"]))
    cfg = load_config(path, environ=env, overrides=flags)
    assert cfg.server.port == 3333  # flag > env > file
    assert cfg.server.host == "10.0.0.1"  # file only
    assert cfg.server.max_body_mb == 5
    assert cfg.upstream.base_url == "http://flag.example/v1"
    assert cfg.upstream.timeout_s == 22.5  # env > file
    assert cfg.compaction.enabled is False
    assert cfg.compaction.keep_recent_tokens == 111
    assert cfg.tool_results.skip_tools == ["read_file", "mcp_*"]
    assert cfg.models["default"].context_window == 200000
    assert cfg.upstream.api_key is not None and cfg.upstream.api_key.get_secret_value() == "12345"
    assert cfg.compaction.focus == "yes"
    # Without the flags, env wins over the file; without env, the file wins over defaults.
    assert load_config(path, environ=env).server.port == 2222
    assert load_config(path, environ={}).server.port == 1111


def test_config_file_from_env_and_empty_env_value_unsets(tmp_path):
    path = _write(tmp_path, "compaction:\n  threshold_tokens: 5000\n")
    cfg = load_config(None, environ={"COMPACTION_PROXY_CONFIG": str(path)})
    assert cfg.compaction.threshold_tokens == 5000
    cfg = load_config(None, environ={"COMPACTION_PROXY_CONFIG": str(path), "COMPACTION_PROXY_COMPACTION__THRESHOLD_TOKENS": ""})
    assert cfg.compaction.threshold_tokens is None


def test_flags_parse():
    args = parse_args(["--config", "c.yaml", "--host", "0.0.0.0", "--port", "9000", "--upstream", "http://u/v1"])
    assert args.config == "c.yaml"
    assert flag_overrides(args) == {"server": {"host": "0.0.0.0", "port": 9000}, "upstream": {"base_url": "http://u/v1"}}
    assert flag_overrides(parse_args([])) == {}
    args = parse_args(["--anthropic-upstream", "http://127.0.0.1:4000"])
    assert flag_overrides(args) == {"anthropic": {"base_url": "http://127.0.0.1:4000"}}
    assert load_config(None, environ={}, overrides=flag_overrides(args)).anthropic.base_url == "http://127.0.0.1:4000"
    args = parse_args(["--gemini-upstream", "http://127.0.0.1:4001/"])
    assert flag_overrides(args) == {"gemini": {"base_url": "http://127.0.0.1:4001/"}}
    assert load_config(None, environ={}, overrides=flag_overrides(args)).gemini.base_url == "http://127.0.0.1:4001"


BAD = [
    # (id, file text or None for a missing file, env, words the one line must contain)
    ("unknown-top", "serverz: {port: 1}\n", {}, "serverz: unknown key"),
    ("unknown-nested", "compaction:\n  treshold_tokens: 5\n", {}, "compaction.treshold_tokens: unknown key"),
    ("unknown-model-key", "models:\n  gpt-4o: {window: 5}\n", {}, "models.gpt-4o.window: unknown key"),
    ("wrong-type", "server:\n  port: eighty\n", {}, "server.port:"),
    ("out-of-range", "compaction: {threshold_percent: 150}\n", {}, "compaction.threshold_percent:"),
    ("bad-url", "upstream: {base_url: ftp://x}\n", {}, "upstream.base_url:"),
    ("section-not-mapping", "store: 5\n", {}, "store:"),
    ("invalid-yaml", "server: [port: 1\n", {}, "invalid YAML"),
    ("not-a-mapping", "- a\n- b\n", {}, "top level must be a mapping"),
    ("unreadable", None, {}, "cannot read"),
    ("env-unknown", "", {"COMPACTION_PROXY_SERVER__PROT": "1"},
     "COMPACTION_PROXY_SERVER__PROT: unknown variable (there is no config key server.prot)"),
    ("env-unknown-section", "", {"COMPACTION_PROXY_SERVR__PORT": "1"},
     "COMPACTION_PROXY_SERVR__PORT: unknown variable (there is no config key servr.port)"),
    ("env-wrong-type", "", {"COMPACTION_PROXY_SERVER__PORT": "http"}, "COMPACTION_PROXY_SERVER__PORT (server.port):"),
    ("env-no-host", "", {"COMPACTION_PROXY_UPSTREAM__BASE_URL": "http://"},
     "COMPACTION_PROXY_UPSTREAM__BASE_URL (upstream.base_url): Value error, has no host"),
    ("no-host", "upstream: {base_url: 'https:///v1'}\n", {}, "upstream.base_url: Value error, has no host"),
    ("anthropic-no-host", "anthropic: {base_url: 'http://:8080'}\n", {}, "anthropic.base_url: Value error, has no host"),
    ("no-workers", "server: {workers: 0}\n", {}, "server.workers: Value error, must be a number of processes"),
    ("workers-word", "", {"COMPACTION_PROXY_SERVER__WORKERS": "many"},
     "COMPACTION_PROXY_SERVER__WORKERS (server.workers): Value error"),
    ("lock-expires-between-beats", "store: {lock_ttl_s: 3, lock_heartbeat_s: 2}\n", {},
     "store: Value error, lock_ttl_s (3 s) must be at least twice lock_heartbeat_s (2 s)"),
]


def test_a_lock_twice_its_beat_is_accepted():
    store = load_config(environ={"COMPACTION_PROXY_STORE__LOCK_TTL_S": "4", "COMPACTION_PROXY_STORE__LOCK_HEARTBEAT_S": "2"}).store
    assert (store.lock_ttl_s, store.lock_heartbeat_s) == (4, 2)


def test_workers_auto_is_one_per_core():
    assert load_config(environ={"COMPACTION_PROXY_SERVER__WORKERS": "auto"}).server.worker_count() == os.cpu_count()
    assert load_config(environ={"COMPACTION_PROXY_SERVER__WORKERS": "3"}).server.worker_count() == 3
    assert load_config(environ={}).server.worker_count() == 1


@pytest.mark.parametrize("text,env,words", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_config_raises_one_line(tmp_path, text, env, words):
    path = tmp_path / "missing.yaml" if text is None else _write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_config(path, environ=env)
    assert words in str(exc.value)
    assert "\n" not in str(exc.value)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_PROXY_")}
    env.update(extra)
    return env


@pytest.mark.parametrize("case", ["unknown-nested", "wrong-type", "invalid-yaml", "unreadable", "env-unknown",
                                  "env-unknown-section"])
def test_console_script_exits_2_naming_the_key(tmp_path, case):
    _, text, env, words = next(b for b in BAD if b[0] == case)
    path = tmp_path / "missing.yaml" if text is None else _write(tmp_path, text)
    r = subprocess.run([str(SCRIPT), "--config", str(path)], env=_env(**env), cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and lines[0].startswith("compaction-proxy: config error:")
    assert r.stdout == ""


def test_an_upstream_without_a_host_is_refused_at_start(tmp_path):
    """`--upstream http://` used to be accepted and fail every request; now the start is refused."""
    r = subprocess.run([str(SCRIPT), "--upstream", "http://", "--port", "0"], env=_env(), cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == "compaction-proxy: config error: upstream.base_url: Value error, has no host " \
                               "(http://HOST[:PORT][/PATH])"


def test_a_flag_over_a_bad_variable_is_not_blamed_on_the_variable():
    env = {"COMPACTION_PROXY_SERVER__PORT": "http", "COMPACTION_PROXY_UPSTREAM__BASE_URL": "http://ok/v1"}
    with pytest.raises(ConfigError) as exc:
        load_config(None, environ=env, overrides={"upstream": {"base_url": "http://"}, "server": {"port": 1}})
    assert str(exc.value).startswith("upstream.base_url: Value error, has no host")


def test_python_m_proxy_help():
    r = subprocess.run([sys.executable, "-m", "proxy", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    for flag in ("--config", "--host", "--port", "--upstream", "--anthropic-upstream", "--gemini-upstream"):
        assert flag in r.stdout


# -- the real process ----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(proc: subprocess.Popen, port: int, timeout: float = 30) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"proxy exited early: {proc.communicate()[1]}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("proxy did not become healthy")


def _stop(proc: subprocess.Popen, *, signal_sent: bool = False) -> tuple[int, str]:
    if not signal_sent:
        proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"proxy ignored SIGTERM:\n{err}")
    return proc.returncode, err


def _start(tmp_path: Path, fake: FakeUpstream, **env: str) -> tuple[subprocess.Popen, int]:
    # All three layers at once: the store from the file, the log level from env, port and upstream from flags.
    cfg = _write(tmp_path, "store:\n  url: memory://\nserver:\n  port: 1\n")
    port = _free_port()
    proc = subprocess.Popen(
        [str(SCRIPT), "--config", str(cfg), "--port", str(port), "--upstream", fake.base_url],
        env=_env(COMPACTION_PROXY_SERVER__LOG_LEVEL="info", **env),
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        _wait_healthy(proc, port)
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    return proc, port


def test_console_script_serves_and_stops_on_sigterm(tmp_path):
    import asyncio

    sigterm_sent = False
    with FakeUpstream(reply="pong") as fake:
        proc, port = _start(tmp_path, fake)
        try:
            client = sync_openai_client(f"http://127.0.0.1:{port}/v1", "sk-sub", timeout=20)
            raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=[{"role": "user", "content": "ping"}])
            assert raw.parse().choices[0].message.content == "pong"
            assert raw.headers["x-compaction-status"] == "none"
            assert client.models.list().data[0].id == "gpt-4o-mini"

            # SIGTERM while a stream is in flight: the stream still completes, then the process exits 0.
            fake.release_last_chunk = asyncio.Event()
            fake.last_chunk_waiting = asyncio.Event()
            stream = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "s"}], stream=True)
            it = iter(stream)
            first = next(it)
            assert first.choices[0].delta.role == "assistant"
            deadline = time.monotonic() + 10
            while not fake.last_chunk_waiting.is_set():
                assert time.monotonic() < deadline
                time.sleep(0.01)
            proc.send_signal(signal.SIGTERM)
            sigterm_sent = True
            time.sleep(0.2)
            fake.loop.call_soon_threadsafe(fake.release_last_chunk.set)
            rest = list(it)
            assert rest[-1].choices[0].finish_reason == "stop"
            client.close()
        finally:
            code, err = _stop(proc, signal_sent=sigterm_sent)
    assert code == 0, err
    assert "Traceback" not in err
    # the start-up line says where each kind of client's requests go
    assert (
        f"listening on http://127.0.0.1:{port} -> {fake.base_url}, Anthropic clients -> https://api.anthropic.com"
        " (store memory://)"
    ) in err


def test_counts_exactly_offline_with_an_empty_tiktoken_cache(tmp_path):
    """TIKTOKEN_CACHE_DIR names an empty folder and there is no network: tiktoken cannot find or
    fetch anything, so the console script falls back to the encodings the package ships."""
    empty = tmp_path / "no-encodings"
    empty.mkdir()
    offline = {"TIKTOKEN_CACHE_DIR": str(empty), "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
               "https_proxy": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9", "NO_PROXY": "", "no_proxy": ""}
    with FakeUpstream() as fake:
        proc, port = _start(tmp_path, fake, **offline)
        try:
            client = sync_openai_client(f"http://127.0.0.1:{port}/v1", "k", timeout=20)
            text = "compaction-proxy counts tokens exactly"  # o200k_base: 7 tokens; bytes/4 would be 10
            raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=[{"role": "user", "content": text}])
            assert raw.parse().choices[0].message.content
            # 3 overhead + "user" (1) + 7 for the content + 3 for the reply
            assert raw.headers["x-compaction-tokens-before"] == str(3 + 1 + 7 + 3)
            client.close()
        finally:
            code, err = _stop(proc)
    assert code == 0, err
    assert list(empty.iterdir()) == []  # nothing was downloaded
    assert "estimated" not in err, err
