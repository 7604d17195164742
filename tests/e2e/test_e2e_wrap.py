"""`compaction-proxy wrap` with the real agents: `wrap claude -- -p TASK ...`, `wrap codex --
exec ... TASK` and `wrap gemini -- -p TASK ...` start their own proxy, point the agent at it (Claude
Code by ANTHROPIC_BASE_URL, Codex by `-c model_providers...` overrides: nothing in a config file,
Gemini CLI by GOOGLE_GEMINI_BASE_URL), and the agent finishes the same log-reading task as
test_e2e_claude_code.py / test_e2e_codex.py / test_e2e_gemini_cli.py against the strict fakes,
its history compacted along the way; the agent's exit status is wrap's, and the proxy is gone
after it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.fakes.gemini import FakeGemini
from proxy.fakes.messages import FakeMessages
from proxy.fakes.responses import FakeResponses
from support.loopback import accepts

from . import test_e2e_claude_code as claude_test
from . import test_e2e_codex as codex_test
from . import test_e2e_gemini_cli as gemini_test
from .agent_task import DONE, LOGS, TASK, WINDOW, compacted_twice, write_logs

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ANNOUNCED = re.compile(r"^compaction-proxy wrap: (claude|codex|gemini) -> proxy http://127\.0\.0\.1:(\d+) \(dashboard ")


@pytest.fixture(scope="module", autouse=True)
def _e2e_venv_required() -> None:
    """(conftest's gate on the llama.cpp venv, overridden: these tests use the fakes and the agents
    only; the agents' fixtures skip, or fail under CI, without them)"""


def wrap(tmp_path: Path, agent_exe: Path, settings: dict[str, Any], args: list[str], work: Path,
         **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m proxy wrap --config FILE AGENT -- ARGS`, the agent found on PATH."""
    config = tmp_path / "wrap.yaml"
    config.write_text(yaml.safe_dump({"server": {"log_level": "debug", "shutdown_grace_s": 5},
                                      "compaction": {"prepare_percent": 0}, **settings}))
    base = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_PROXY_")}
    full_env = {**base, "PATH": f"{agent_exe.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-m", "proxy", "wrap", "--config", str(config), "--log",
                           str(tmp_path / "wrap.log"), agent_exe.name, "--", *args],
                          cwd=work, env=full_env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=360)


def announced_port(run: subprocess.CompletedProcess[str]) -> int:
    first = run.stderr.splitlines()[0] if run.stderr else ""
    m = ANNOUNCED.match(first)
    assert m, run.stderr[-2000:]
    return int(m.group(2))


def test_wrap_runs_claude_code_through_its_own_proxy(claude_code: Path, tmp_path: Path):
    work = tmp_path / "work"
    work.mkdir()
    logs = write_logs(work)
    with FakeMessages() as fake:
        fake.reply = claude_test.agent(logs)
        run = wrap(tmp_path, claude_code, {"anthropic": {"base_url": fake.base_url},
                                           "models": {claude_test.MODEL: {"context_window": WINDOW}}},
                   ["-p", TASK, "--model", claude_test.MODEL, "--output-format", "json", "--allowedTools", "Read",
                    "--max-turns", "30"], work,
                   ANTHROPIC_API_KEY="sk-ant-e2e-claude-code", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
                   DISABLE_AUTOUPDATER="1", DISABLE_TELEMETRY="1")
        requests = list(fake.requests)
    calls = [r for r in requests if r.kind == "messages"]
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:], [(r.kind, r.status) for r in requests])
    result = json.loads(run.stdout)
    assert result["is_error"] is False and result["result"] == DONE, result
    assert [claude_test.last_log_read(r.json) for r in calls if r.status == 200][-1] == LOGS
    compacted_twice(requests, calls, claude_test.forwarded_summary)
    assert not accepts(announced_port(run))  # its proxy is gone
    log = (tmp_path / "wrap.log").read_text()
    assert "path=/v1/messages" in log and "Traceback" not in log


def test_wrap_runs_codex_through_its_own_proxy(codex: Path, tmp_path: Path):
    logs, work, home = codex_test.setup(tmp_path)
    with FakeResponses() as fake:
        fake.reply = codex_test.agent(logs)
        run = wrap(tmp_path, codex, {"upstream": {"base_url": fake.base_url},
                                     "models": {codex_test.MODEL: {"context_window": WINDOW}}},
                   ["exec", "--skip-git-repo-check", "--json", "-s", "danger-full-access", "-m", codex_test.MODEL, TASK],
                   work, CODEX_HOME=str(home), OPENAI_API_KEY="sk-e2e-codex")
        requests = list(fake.requests)
    calls = [r for r in requests if r.kind == "responses"]
    codex_test.finished(run, requests)
    assert [codex_test.last_log_read(r.json) for r in calls if r.status == 200][-1] == LOGS
    compacted_twice(requests, calls, codex_test.forwarded_summary)
    assert not list(home.glob("*.toml"))  # pointed by overrides: no config file written
    assert not accepts(announced_port(run))  # its proxy is gone
    log = (tmp_path / "wrap.log").read_text()
    assert "path=/v1/responses" in log and "Traceback" not in log


def test_wrap_runs_gemini_cli_through_its_own_proxy(gemini_cli: Path, tmp_path: Path):
    logs, work, home = gemini_test.setup(tmp_path, gemini_test.SETTINGS)
    with FakeGemini() as fake:
        fake.reply = gemini_test.agent(logs)
        run = wrap(tmp_path, gemini_cli, {"gemini": {"base_url": fake.base_url},
                                          "models": {gemini_test.MODEL: {"context_window": WINDOW}}},
                   gemini_test.cli_args(), work, HOME=str(home), GEMINI_API_KEY=gemini_test.KEY)
        requests = list(fake.requests)
    calls = gemini_test.finished(run, requests)
    compacted_twice(requests, calls, gemini_test.forwarded_summary)
    assert not accepts(announced_port(run))  # its proxy is gone
    log = (tmp_path / "wrap.log").read_text()
    assert ":streamGenerateContent" in log and "Traceback" not in log and gemini_test.KEY not in log


def test_wrap_gemini_signed_in_with_google_compacts_its_code_assist_turns(gemini_cli: Path, tmp_path: Path):
    """Signed in with Google, Gemini CLI reads CODE_ASSIST_ENDPOINT: wrap points it at its proxy, and
    the proxy (no Code Assist upstream in its config) sends those calls where they were going, the
    user's own CODE_ASSIST_ENDPOINT (the fake, standing for Google's), compacted."""
    logs, work, home = gemini_test.setup(tmp_path, gemini_test.CODE_ASSIST_SETTINGS)
    with FakeGemini() as fake:
        fake.reply = gemini_test.agent(logs)
        run = wrap(tmp_path, gemini_cli, {"gemini": {"base_url": fake.base_url}, "upstream": {"base_url": fake.base_url},
                                          "models": {gemini_test.CODE_ASSIST_MODEL: {"context_window": WINDOW}}},
                   gemini_test.cli_args(), work, HOME=str(home), CODE_ASSIST_ENDPOINT=fake.base_url,
                   **gemini_test.CODE_ASSIST_ENV)
        requests = list(fake.requests)
    gemini_test.code_assist_finished(run, requests)
    assert not accepts(announced_port(run))
    log = (tmp_path / "wrap.log").read_text()
    assert "/v1internal:streamGenerateContent" in log and "Traceback" not in log and gemini_test.TOKEN not in log
