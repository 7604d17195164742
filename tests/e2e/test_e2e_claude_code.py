"""The real Claude Code CLI through the proxy: `claude -p` runs a task whose tool calls (the real
Read tool, reading real files) outgrow the window the proxy is configured with, against the strict
fake Messages upstream (scripted: it asks for one log after another, then answers). The history is
summarized, the summary reused byte for byte, then summarized again with the first one folded in.

What Claude Code sends is what it sends: its system blocks and tools, its cache breakpoints, adaptive
thinking, the `context_management` it asks for on every request, its beta headers. The proxy must
compact that history (tool results as notes, older turns as a summary) without breaking any of
it: every request reaches the fake valid (pairing, roles, signatures bound to their prefix, at
most 4 breakpoints), and Claude Code finishes its task.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from proxy.fakes.messages import FakeMessages

from .agent_task import DONE, LOGS, TASK, WINDOW, compacted_twice, newest_log, write_logs

pytestmark = pytest.mark.e2e

MODEL = "claude-opus-5-5"


def last_log_read(body: dict[str, Any]) -> int:
    """Which log the newest tool result of the request is (0: none yet). The forwarded body may be
    compacted, so only its newest message is read."""
    content = body["messages"][-1]["content"]
    return newest_log(json.dumps(content)) if isinstance(content, list) else 0


def agent(logs: list[Path]):
    def reply(view: dict[str, Any]) -> Any:
        done = last_log_read(view["raw"])
        if done >= LOGS:
            return DONE
        return {"content": f"Reading log {done + 1}.",
                "tool_uses": [{"name": "Read", "input": {"file_path": str(logs[done])}}]}
    return reply


def forwarded_summary(body: dict[str, Any]) -> str | None:
    first = body["messages"][0]["content"]
    text = first[0].get("text", "") if isinstance(first, list) and first and isinstance(first[0], dict) else ""
    return text if "<summary>" in text else None


def test_claude_code_finishes_a_task_the_proxy_compacts_along_the_way(claude_code: Path, start_proxy, tmp_path: Path):
    work = tmp_path / "work"
    work.mkdir()
    logs = write_logs(work)
    with FakeMessages() as fake:
        fake.reply = agent(logs)
        proxy = start_proxy(anthropic={"base_url": fake.base_url}, upstream={"base_url": fake.base_url},
                            models={MODEL: {"context_window": WINDOW}},
                            compaction={"prepare_percent": 0})
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "ANTHROPIC_BASE_URL": proxy.url,
               "ANTHROPIC_API_KEY": "sk-ant-e2e-claude-code", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
               "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1"}
        run = subprocess.run(
            [str(claude_code), "-p", TASK,
             "--model", MODEL, "--output-format", "json", "--allowedTools", "Read", "--max-turns", "30"],
            cwd=work, env=env, capture_output=True, text=True, timeout=300)
        requests = list(fake.requests)
    calls = [r for r in requests if r.kind == "messages"]
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:], [(r.kind, r.status) for r in requests])
    result = json.loads(run.stdout)
    assert result["is_error"] is False and result["result"] == DONE, result

    # Claude Code read every log for real (its Read tool's output came back each time) ...
    assert [last_log_read(r.json) for r in calls if r.status == 200][-1] == LOGS
    # ... in requests as it sends them: its own context_management and thinking on every one
    assert all(r.json.get("context_management") is not None and r.json.get("thinking") for r in calls)
    # and the proxy compacted that history twice
    summaries = compacted_twice(requests, calls, forwarded_summary)
    assert len(calls[-1].json["messages"]) < 1 + 2 * LOGS  # Claude Code's own: a request and two messages a log
    # every request the fake refused was refused once and sent again mended (stale thinking)
    refused = [r for r in calls if r.status != 200]
    assert all(r.status == 400 for r in refused), [(r.status, r.body[:200]) for r in refused]
    assert len(refused) <= len(summaries)
    assert "Traceback" not in proxy.log_text()
