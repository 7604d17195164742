"""`compaction-proxy wrap`: the real command (`python -m proxy wrap`) runs a stand-in agent
(tests/support/fake_agent.py, on PATH under the agent's name) that reads its base URL as that
agent does and sends its requests with the real SDK clients; they go through the proxy that `wrap`
started to the strict fake upstreams. The agent's exit status comes back, Ctrl-C is the agent's
(the proxy serves on after it), SIGTERM is passed to the agent, `--proxy` reuses a running proxy.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from proxy.cmdline import flag_overrides
from proxy.fakes.chat import FakeUpstream
from proxy.fakes.messages import FakeMessages
from proxy.fakes.responses import FakeResponses
from proxy.config import load_config
from proxy.launch import AGENTS, exit_status, own_defaults, parse, pointing, proxy_origin
from proxy.protocols.gemini.code_assist import CODE_ASSIST_URL
from support.loopback import accepts, serving
from support.replicas import Replica
from support.waiting import until

ROOT = Path(__file__).resolve().parents[1]
AGENT = ROOT / "tests" / "support" / "fake_agent.py"
ANNOUNCED = re.compile(r"^compaction-proxy wrap: (\S+) -> proxy (http://127\.0\.0\.1:(\d+)) \(dashboard "
                       r"http://127\.0\.0\.1:\3/dashboard, log (.+)\)$")
BOUND_S = 60


def shim_dir(tmp_path: Path) -> Path:
    """A bin directory with a shim per agent name (and `any-agent`) running the stand-in."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in [*AGENTS, "any-agent"]:
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{AGENT}" {name} "$@"\n')
        shim.chmod(0o755)
    return bin_dir


class Upstreams:
    def __init__(self, chat: FakeUpstream, responses: FakeResponses, messages: FakeMessages, gemini: str,
                 gemini_seen: list[dict[str, Any]]) -> None:
        self.chat, self.responses, self.messages = chat, responses, messages
        self.gemini, self.gemini_seen = gemini, gemini_seen


@pytest.fixture
async def upstreams():
    seen: list[dict[str, Any]] = []

    async def gemini_echo(request: web.Request) -> web.Response:  # stands for Google's API: records, answers
        seen.append({"path": request.path_qs, "key": request.headers.get("x-goog-api-key"),
                     "bearer": request.headers.get("authorization"), "body": await request.json()})
        return web.json_response({"text": "gemini answered"})

    app = web.Application()
    app.router.add_post("/{tail:.*}", gemini_echo)
    async with FakeUpstream(reply="chat answered") as chat, FakeResponses() as responses, \
            FakeMessages() as messages, serving(app) as gemini:
        yield Upstreams(chat, responses, messages, gemini, seen)


def wrap_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_PROXY_") and k not in (
        "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "OPENAI_API_KEY", "OPENCODE_CONFIG_CONTENT", "GOOGLE_GEMINI_BASE_URL",
        "CODE_ASSIST_ENDPOINT")}
    env.update(PATH=f"{shim_dir(tmp_path)}:{env.get('PATH', '/usr/bin:/bin')}", XDG_CACHE_HOME=str(tmp_path / "cache"),
               FAKE_AGENT_REPORT=str(tmp_path / "report.json"), PYTHONPATH=str(ROOT))
    env.update(extra)
    return env


async def run_wrap(tmp_path: Path, args: list[str], env: dict[str, str], **kw: Any) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(sys.executable, "-m", "proxy", "wrap", *args, cwd=tmp_path, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, **kw)


async def finish(proc: asyncio.subprocess.Process) -> tuple[int, str]:
    _, err = await asyncio.wait_for(proc.communicate(), BOUND_S)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


def upstream_flags(u: Upstreams, agent: str) -> list[str]:
    openai_side = u.responses.base_url if agent == "codex" else u.chat.base_url
    return ["--upstream", openai_side, "--anthropic-upstream", u.messages.base_url]


EXPECTED = {  # the requests each agent's stand-in sends, by what it reads
    "claude": {"messages"}, "codex": {"responses"}, "gemini": {"gemini", "code_assist"},
    "opencode": {"chat", "messages"}, "aider": {"chat", "messages"}, "goose": {"chat", "messages"},
    None: {"chat", "messages", "gemini", "code_assist"},
}
GEMINI_SEEN = [  # relayed as they came: path, the client's key or token, the body
    {"path": "/v1beta/models/gemini-2.5-pro:generateContent", "key": "gemini-key", "bearer": None,
     "body": {"contents": [{"role": "user", "parts": [{"text": "hello"}]}]}},
    # signed in with Google: to the user's own CODE_ASSIST_ENDPOINT (the echo), which wrap pointed at the proxy
    {"path": "/v1internal:loadCodeAssist", "key": None, "bearer": "Bearer ya29.fake-agent",
     "body": {"metadata": {"ideType": "IDE_UNSPECIFIED", "pluginType": "GEMINI"}}},
]


@pytest.mark.parametrize("agent", [*AGENTS, None], ids=[*AGENTS, "any-command"])
async def test_each_agent_reaches_its_upstream_through_the_proxy_wrap_started(tmp_path, upstreams, agent):
    env = wrap_env(tmp_path, FAKE_AGENT_EXIT="3", COMPACTION_PROXY_GEMINI__BASE_URL=upstreams.gemini,
                   CODE_ASSIST_ENDPOINT=upstreams.gemini)
    args = [*upstream_flags(upstreams, agent or ""), *([agent, "--", "--flag", "x y"] if agent
                                                       else ["--", "any-agent", "--flag", "x y"])]
    code, err = await finish(await run_wrap(tmp_path, args, env))
    lines = err.strip().splitlines()
    assert code == 3, err  # the agent's own status
    assert len(lines) == 1 and (m := ANNOUNCED.match(lines[0])), err  # one line: where the proxy and dashboard are
    origin, port = m.group(2), int(m.group(3))
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["args"][-2:] == ["--flag", "x y"]  # the user's arguments, as given, after wrap's own
    assert set(report["requests"]) == EXPECTED[agent]
    for kind, answer in report["requests"].items():
        assert answer["status"] == 200 and answer["text"], (kind, answer)
        if kind not in ("gemini", "code_assist"):  # the proxy's own report on each protocol it serves
            assert answer["compaction"] == "none", (kind, answer)
    urls = [*report["env"].values(), *report["args"]]
    assert any(origin in u for u in urls) and not any("api.openai.com" in u or "anthropic.com" in u for u in urls)
    if "gemini" in report["requests"]:
        assert upstreams.gemini_seen == GEMINI_SEEN
        assert report["env"]["CODE_ASSIST_ENDPOINT"] == origin
    assert not accepts(port)  # the proxy wrap started is stopped
    log = Path(m.group(4)).read_text()
    assert "Traceback" not in log and "drained" in log
    assert (tmp_path / "cache" / "compaction-proxy" / "wrap.db").exists()  # its store: the cache, not the cwd
    assert not list(tmp_path.glob("*.db"))


async def test_ctrl_c_is_the_agents_and_the_proxy_serves_on(tmp_path, upstreams):
    """The terminal sends Ctrl-C to the whole foreground process group: the agent gets it once
    (wrap passes nothing more on), decides for itself (here: one more request, then exit 130),
    and the proxy still answers that request."""
    ready = tmp_path / "ready"
    env = wrap_env(tmp_path, FAKE_AGENT_READY=str(ready), COMPACTION_PROXY_GEMINI__BASE_URL=upstreams.gemini,
                   CODE_ASSIST_ENDPOINT=upstreams.gemini)
    proc = await run_wrap(tmp_path, [*upstream_flags(upstreams, ""), "--", "any-agent"], env, start_new_session=True)
    await until(ready.exists, "the agent to start", timeout=BOUND_S)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: wrap, and the agent in its group
    code, err = await finish(proc)
    assert code == 130, err
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["sigints"] == 1
    assert all(a["status"] == 200 for a in report["requests"].values())


async def test_sigterm_to_wrap_is_passed_to_the_agent(tmp_path, upstreams):
    ready = tmp_path / "ready"
    env = wrap_env(tmp_path, FAKE_AGENT_READY=str(ready))  # waits for SIGINT: SIGTERM's default action ends it
    proc = await run_wrap(tmp_path, [*upstream_flags(upstreams, ""), "--", "any-agent"], env, start_new_session=True)
    await until(ready.exists, "the agent to start", timeout=BOUND_S)
    proc.send_signal(signal.SIGTERM)  # to wrap alone
    code, err = await finish(proc)
    assert code == 128 + signal.SIGTERM, err  # the agent died of it, and wrap says so as a shell does
    assert not (tmp_path / "report.json").exists()


async def test_proxy_url_reuses_a_running_proxy_and_leaves_it_running(tmp_path, upstreams):
    replica = Replica(tmp_path, "running", upstreams.chat.base_url, "memory://",
                      {"anthropic": {"base_url": upstreams.messages.base_url}})
    await asyncio.to_thread(replica.start)
    try:
        await asyncio.to_thread(replica.wait_ready)
        env = wrap_env(tmp_path, COMPACTION_PROXY_GEMINI__BASE_URL=upstreams.gemini)
        code, err = await finish(await run_wrap(tmp_path, ["--proxy", replica.base_url + "/", "claude"], env))
        assert code == 0, err
        assert err.strip() == (f"compaction-proxy wrap: claude -> proxy {replica.root} (already running; "
                               f"dashboard {replica.root}/dashboard)")
        report = json.loads((tmp_path / "report.json").read_text())
        assert report["env"]["ANTHROPIC_BASE_URL"] == replica.root
        assert report["requests"]["messages"]["status"] == 200
        assert replica.proc.poll() is None  # still running
        assert "path=/v1/messages" in replica.log_text()  # the request went through it
        assert not (tmp_path / "cache").exists()  # no proxy of its own: no store, no log
    finally:
        replica.stop()


async def test_no_proxy_at_the_url_and_no_such_agent_are_one_line(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    code, err = await finish(await run_wrap(tmp_path, ["--proxy", f"http://127.0.0.1:{port}", "claude"],
                                            wrap_env(tmp_path)))
    assert code == 2 and err.startswith(f"compaction-proxy wrap: no proxy answers at http://127.0.0.1:{port}/healthz")
    code, err = await finish(await run_wrap(tmp_path, ["--", "no-such-agent-here"], wrap_env(tmp_path)))
    assert (code, err) == (127, "compaction-proxy wrap: no-such-agent-here: command not found\n")
    code, err = await finish(await run_wrap(tmp_path, ["--upstream", "http://", "claude"], wrap_env(tmp_path)))
    assert code == 2 and err.startswith("compaction-proxy wrap: config error: upstream.base_url:")


# ---- the pure parts --------------------------------------------------------------------------


def test_the_started_proxy_compacts_code_assist_where_the_agent_was_sending_it(tmp_path):
    """wrap points Gemini CLI's CODE_ASSIST_ENDPOINT at the proxy, so the proxy it starts sends
    those calls where they were going (compacted as the Gemini API's): the user's own endpoint,
    else Google's; a config that names one wins (defaults are below the file)."""
    assert own_defaults(tmp_path, {})["gemini"] == {"code_assist_base_url": CODE_ASSIST_URL}
    mine = own_defaults(tmp_path, {"CODE_ASSIST_ENDPOINT": "http://127.0.0.1:1/"})
    assert mine["gemini"] == {"code_assist_base_url": "http://127.0.0.1:1/"}
    assert load_config(None, environ={}, defaults=mine).gemini.code_assist_base_url == "http://127.0.0.1:1"
    named = {"COMPACTION_PROXY_GEMINI__CODE_ASSIST_BASE_URL": "http://127.0.0.1:2"}
    assert load_config(None, environ=named, defaults=mine).gemini.code_assist_base_url == "http://127.0.0.1:2"
    assert pointing("gemini", "http://o", {}).env == {"GOOGLE_GEMINI_BASE_URL": "http://o", "CODE_ASSIST_ENDPOINT": "http://o"}


def test_wraps_flags_name_each_upstream_as_compaction_proxys_do():
    """(`--gemini-upstream`, added to compaction-proxy's flags, crashed every `wrap` until wrap took it)"""
    opts = parse(["--upstream", "http://o/v1", "--anthropic-upstream", "http://a", "--gemini-upstream", "http://g",
                  "gemini"]).options
    assert flag_overrides(opts) == {"upstream": {"base_url": "http://o/v1"}, "anthropic": {"base_url": "http://a"},
                                    "gemini": {"base_url": "http://g"}}
    assert flag_overrides(parse(["claude"]).options) == {}


def test_codex_is_pointed_by_overrides_and_its_key_by_what_is_set():
    with_key = pointing("codex", "http://127.0.0.1:5", {"OPENAI_API_KEY": "sk-x"})
    assert with_key.env == {}
    settings = with_key.args[1::2]
    assert with_key.args[::2] == ["-c"] * len(settings)
    assert 'model_providers.compaction_proxy.base_url="http://127.0.0.1:5/v1"' in settings
    assert 'model_providers.compaction_proxy.wire_api="responses"' in settings
    assert 'model_providers.compaction_proxy.env_key="OPENAI_API_KEY"' in settings
    login = pointing("codex", "http://127.0.0.1:5", {}).args
    assert "model_providers.compaction_proxy.requires_openai_auth=true" in login  # Codex's own login


def test_opencode_keeps_the_inline_config_the_user_set():
    mine = {"model": "anthropic/claude-sonnet-4-5", "provider": {"anthropic": {"options": {"timeout": 5}}}}
    env = pointing("opencode", "http://127.0.0.1:5", {"OPENCODE_CONFIG_CONTENT": json.dumps(mine)}).env
    merged = json.loads(env["OPENCODE_CONFIG_CONTENT"])
    assert merged["model"] == mine["model"]
    assert merged["provider"]["anthropic"]["options"] == {"timeout": 5, "baseURL": "http://127.0.0.1:5/v1"}
    assert merged["provider"]["openai"]["options"] == {"baseURL": "http://127.0.0.1:5/v1"}


def test_urls_statuses_and_arguments():
    assert proxy_origin("http://h:1/v1/") == proxy_origin("http://h:1") == "http://h:1"
    assert [exit_status(c) for c in (0, 3, -2, -15)] == [0, 3, 130, 143]
    inv = parse(["--proxy", "http://h:1", "codex", "--", "exec", "--", "x"])
    assert (inv.agent, inv.command, inv.options.proxy) == ("codex", ["codex", "exec", "--", "x"], "http://h:1")
    assert parse(["--", "my-agent", "-v"]).command == ["my-agent", "-v"]
    with pytest.raises(SystemExit):
        parse([])
    with pytest.raises(SystemExit):
        parse(["vim"])  # not an agent wrap knows: `wrap -- vim`
