"""The real Codex CLI's own compaction through the proxy (issue 41): Codex 0.171 with its
`remote_compaction_v2` feature on asks the API for a compaction by appending a
`compaction_trigger` item to an ordinary streamed `/v1/responses` request, and needs exactly one
`compaction` output item back. It does so only for a provider it takes for OpenAI's
(`supports_remote_compaction`: one named "OpenAI", or Azure): run both ways, its built-in
provider with the proxy as `openai_base_url` (a WebSocket, the key from CODEX_API_KEY) and a
custom provider of that name (HTTP). Against a fake upstream that does not know
the item, the proxy (`responses.native_compaction: auto`) sends it up once, answers the 400 with
its own item, answers every later trigger itself, and expands the item Codex then carries into
its summary.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from proxy.fakes.responses import FakeResponses

from .agent_task import DONE, LOGS, TASK, WINDOW
from .test_e2e_codex import MODEL, finished, forwarded_summary, last_log_read, setup

pytestmark = pytest.mark.e2e

AUTO_COMPACT_TOKENS = 14000  # Codex's own limit: its instructions and tools are ~8200 tokens, each log ~1000


def remembering_agent(logs: list[Path]):
    """The task's model: one `cat` per log, then done. What it has read it remembers across
    Codex's compactions (which drop the tool outputs a request would show), as a model reads it
    from the summary."""
    seen = [0]

    def reply(view: dict[str, Any]) -> Any:
        seen[0] = done = max(seen[0], last_log_read(view["raw"]))
        if done >= LOGS:
            return DONE
        return {"content": f"Reading log {done + 1}.", "reasoning": f"The next log is number {done + 1}.",
                "tool_calls": [{"name": "exec_command", "arguments": json.dumps({"cmd": f"cat {logs[done]}"})}]}

    return reply


def run_codex_v2(codex: Path, proxy: Any, work: Path, home: Path, *, builtin: bool) -> subprocess.CompletedProcess[str]:
    """`codex exec` of the task with v2 on and an auto-compaction limit passed several times during
    the task; its provider the built-in OpenAI one with the proxy as `openai_base_url` (`builtin`:
    over a WebSocket), or a custom one named "OpenAI" (over HTTP)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home.parent), "CODEX_HOME": str(home),
           "OPENAI_API_KEY": "sk-e2e-codex", "CODEX_API_KEY": "sk-e2e-codex"}
    provider = ["-c", f'openai_base_url="{proxy.base_url}"'] if builtin else [
        "-c", 'model_provider="proxy"', "-c", 'model_providers.proxy.name="OpenAI"',
        "-c", f'model_providers.proxy.base_url="{proxy.base_url}"', "-c", 'model_providers.proxy.env_key="OPENAI_API_KEY"',
        "-c", 'model_providers.proxy.wire_api="responses"']
    settings = [*provider, "-c", "features.remote_compaction_v2=true",
                "-c", f"model_auto_compact_token_limit={AUTO_COMPACT_TOKENS}"]
    return subprocess.run(
        [str(codex), "exec", "--skip-git-repo-check", "--json", "-s", "danger-full-access", "-m", MODEL, *settings,
         TASK], cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("builtin", [False, True], ids=["http", "websocket"])
def test_codex_remote_compaction_v2_is_answered_by_the_proxy(codex: Path, start_proxy, tmp_path: Path, builtin: bool):
    logs, work, home = setup(tmp_path)
    with FakeResponses(compaction_trigger=False) as fake:
        fake.reply = remembering_agent(logs)
        proxy = start_proxy(upstream={"base_url": fake.base_url}, models={MODEL: {"context_window": WINDOW}})
        run = run_codex_v2(codex, proxy, work, home, builtin=builtin)
        requests = list(fake.requests)
    finished(run, requests)
    calls = [r for r in requests if r.kind == "responses"]
    triggers = [r for r in calls if (r.json.get("input") or [{}])[-1].get("type") == "compaction_trigger"]
    # the trigger went up once, was refused, and every compaction after was answered here
    assert [r.status for r in triggers] == [400]
    compactions = [r for r in requests if r.kind == "summarizer"]
    assert len(compactions) >= 2, [(r.kind, r.status) for r in requests]
    # Codex carried the proxy's item into its next requests; the upstream saw its summary instead
    after = calls[calls.index(triggers[0]) + 1:]
    assert all("cpx1." not in json.dumps(r.json) for r in calls)
    assert sum(1 for r in after if forwarded_summary(r.json)) >= 2
    assert all(r.status == 200 for r in calls if r not in triggers)
    assert all(r.transport == ("websocket" if builtin else "http") for r in calls)
    assert "Traceback" not in proxy.log_text()
