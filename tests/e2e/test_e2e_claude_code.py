"""The real Claude Code CLI through the proxy: `claude -p` runs a task whose tool calls (the real
Read tool, reading real files) outgrow the window the proxy is configured with, against the strict
fake Messages upstream (scripted: it asks for one log after another, then answers).

What Claude Code sends is what it sends: its system blocks and tools, its cache breakpoints, adaptive
thinking, the `context_management` it asks for on every request, its beta headers. The proxy must
compact that history (tool results as notes, older turns as a summary) without breaking any of
it: every request reaches the fake valid (pairing, roles, signatures bound to their prefix, at
most 4 breakpoints), and Claude Code finishes its task.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from proxy.fakes.messages import FakeMessages

pytestmark = pytest.mark.e2e

MODEL = "claude-opus-5-5"
LOGS = 8
DONE = "All eight logs are read."
TASK = "Read the build logs one by one and tell me when all are read."


def write_logs(root: Path) -> list[Path]:
    """Eight build logs, each ~2.5k tokens, with identifiers a summary must keep."""
    paths = []
    for k in range(1, LOGS + 1):
        lines = [f"LOG FILE {k} of {LOGS}"]
        lines += [f"step {i:03d}: compiled src/pkg{k}/mod_{i:03d}.py in {(i * 7 + k) % 97} ms" for i in range(110)]
        lines.append(f"ERROR E{k}0{k}7: test_ledger_{k} failed at src/pkg{k}/ledger.py:{40 + k}")
        path = root / f"build-{k}.log"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def last_log_read(body: dict[str, Any]) -> int:
    """Which log the newest tool result of the request is (0: none yet). The forwarded body may be
    compacted, so only its newest message is read."""
    content = body["messages"][-1]["content"]
    text = json.dumps(content) if isinstance(content, list) else ""
    found = re.findall(r"LOG FILE (\d+) of", text)
    return int(found[-1]) if found else 0


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
                            models={MODEL: {"context_window": 30000}},
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
    # and the proxy compacted that history: the summarizer was asked, a summary went upstream
    # naming the logs the summarized turns read, and the history upstream is shorter than
    # Claude Code's own (one request and two messages a log)
    assert any(r.kind == "summarizer" for r in requests), [(r.kind, r.status) for r in requests]
    summaries = [s for s in (forwarded_summary(r.json) for r in calls) if s]
    assert summaries, "no request went upstream compacted"
    # what code writes into it holds with a real agent's shapes: the file its Read tool's calls
    # named, the error line of the first log, the user's task verbatim
    assert "build-1.log" in summaries[-1] and "ERROR E1017: test_ledger_1 failed" in summaries[-1]
    assert TASK in summaries[-1]
    assert len(calls[-1].json["messages"]) < 1 + 2 * LOGS
    # every request the fake refused was refused once and sent again mended (stale thinking)
    refused = [r for r in calls if r.status != 200]
    assert all(r.status == 400 for r in refused), [(r.status, r.body[:200]) for r in refused]
    assert len(refused) <= len(summaries)
    assert "Traceback" not in proxy.log_text()
