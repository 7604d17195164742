"""The real Codex CLI through the proxy: `codex exec` runs the task of agent_task.py with its own
exec_command tool (running `cat` on real files) over the Responses API, against the strict fake
Responses upstream, which plays the model (reasoning items with encrypted content included, as
Codex asks with store false).

What Codex sends is what it sends: its developer messages and tools, `client_metadata`,
`prompt_cache_key`, `include: ["reasoning.encrypted_content"]`, its own headers. The proxy must
compact that history (older items as a summary, reasoning kept with its calls) without breaking
it: every request reaches the fake valid (each call with its output, each reasoning item as the
fake made it), and Codex finishes its task. Over a WebSocket (`supports_websockets`) Codex chains its
turns by `previous_response_id`; the proxy reads each as the history it stands for and compacts it
all the same.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from proxy.fakes.responses import FakeResponses

from .agent_task import DONE, LOGS, TASK, WINDOW, compacted_twice, first_log_kept, newest_log, write_logs

pytestmark = pytest.mark.e2e

MODEL = "gpt-5.5"


def last_log_read(body: dict[str, Any]) -> int:
    """Which log the newest tool output of the request shows (0: none yet)."""
    outputs = [it for it in body.get("input") or [] if isinstance(it, dict) and it.get("type") == "function_call_output"]
    return newest_log(json.dumps(outputs[-1].get("output"))) if outputs else 0


def agent(logs: list[Path]):
    def reply(view: dict[str, Any]) -> Any:
        done = last_log_read(view["raw"])
        if done >= LOGS:
            return DONE
        return {"content": f"Reading log {done + 1}.", "reasoning": f"The next log is number {done + 1}.",
                "tool_calls": [{"name": "exec_command", "arguments": json.dumps({"cmd": f"cat {logs[done]}"})}]}
    return reply


def forwarded_summary(body: dict[str, Any]) -> str | None:
    for it in body.get("input") or []:
        content = it.get("content") if isinstance(it, dict) and it.get("type", "message") == "message" else None
        text = content if isinstance(content, str) else json.dumps(content) if isinstance(content, list) else ""
        if "<summary>" in text:
            return text
    return None


def run_codex(codex: Path, proxy: Any, work: Path, home: Path, *config: str) -> subprocess.CompletedProcess[str]:
    """`codex exec` of the task, its model provider the proxy; `config`: more `-c` settings."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home.parent), "CODEX_HOME": str(home),
           "OPENAI_API_KEY": "sk-e2e-codex"}
    provider = ["-c", 'model_provider="proxy"', "-c", 'model_providers.proxy.name="compaction-proxy"',
                "-c", f'model_providers.proxy.base_url="{proxy.base_url}"',
                "-c", 'model_providers.proxy.env_key="OPENAI_API_KEY"',
                "-c", 'model_providers.proxy.wire_api="responses"', *config]
    # (no sandbox: the kernel's may be missing here; the fake model only asks for `cat`)
    return subprocess.run(
        [str(codex), "exec", "--skip-git-repo-check", "--json", "-s", "danger-full-access", "-m", MODEL, *provider, TASK],
        cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)


def finished(run: subprocess.CompletedProcess[str], requests: list[Any]) -> None:
    """Codex exited 0 and its last message is the task's answer."""
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-2000:], [(r.kind, r.status) for r in requests])
    events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    said = [e["item"]["text"] for e in events if e.get("type") == "item.completed"
            and e["item"].get("type") == "agent_message"]
    assert said and said[-1] == DONE, events[-5:]
    assert any(e.get("type") == "turn.completed" for e in events)


def setup(tmp_path: Path) -> tuple[list[Path], Path, Path]:
    work, home = tmp_path / "work", tmp_path / "codex-home"
    work.mkdir()
    home.mkdir()
    return write_logs(work), work, home


def test_codex_finishes_a_task_the_proxy_compacts_along_the_way(codex: Path, start_proxy, tmp_path: Path):
    logs, work, home = setup(tmp_path)
    with FakeResponses() as fake:
        fake.reply = agent(logs)
        proxy = start_proxy(upstream={"base_url": fake.base_url}, models={MODEL: {"context_window": WINDOW}},
                            compaction={"prepare_percent": 0})
        run = run_codex(codex, proxy, work, home)
        requests = list(fake.requests)
    calls = [r for r in requests if r.kind == "responses"]
    finished(run, requests)

    # Codex ran every command for real (its tool's output came back each time) ...
    assert [last_log_read(r.json) for r in calls if r.status == 200][-1] == LOGS
    # ... in requests as it sends them: its metadata, and reasoning it asked to get back
    assert all(r.json.get("client_metadata") and r.json.get("store") is False for r in calls)
    assert all("reasoning.encrypted_content" in r.json.get("include", []) for r in calls)
    # and the proxy compacted that history twice
    compacted_twice(requests, calls, forwarded_summary)
    own = sum(1 for it in calls[-1].json["input"] if it.get("type") == "function_call_output")
    assert own < LOGS  # fewer tool outputs upstream than Codex holds
    assert all(r.status == 200 for r in calls), [(r.status, r.body[:300]) for r in calls if r.status != 200]
    assert "Traceback" not in proxy.log_text()


def test_codex_over_a_websocket_is_compacted_through_the_proxy(codex: Path, start_proxy, tmp_path: Path):
    """With `supports_websockets`, Codex opens one socket to the proxy and the proxy one to the
    upstream: a prewarm `response.create` with `generate: false`, then every turn chained to the
    one before by `previous_response_id`, store false (the socket's own cache), with only its new
    items. The proxy saw every turn and every response of that chain, so it reads each turn as the
    whole history it stands for (proxy/protocols/responses/chain.py): past the threshold it sends that
    history compacted, unchained, and the turns after it chained again to the compacted response,
    with only their new items. Codex finishes; every request is valid."""
    logs, work, home = setup(tmp_path)
    with FakeResponses() as fake:
        fake.reply = agent(logs)
        proxy = start_proxy(upstream={"base_url": fake.base_url}, models={MODEL: {"context_window": WINDOW}},
                            compaction={"prepare_percent": 0})
        run = run_codex(codex, proxy, work, home, "-c", "model_providers.proxy.supports_websockets=true")
        requests = list(fake.requests)
    finished(run, requests)
    sockets = [r for r in requests if r.kind == "websocket"]
    turns = [r for r in requests if r.kind == "responses"]
    assert len(sockets) == 1 and all(r.transport == "websocket" for r in turns), [(r.kind, r.transport) for r in requests]
    assert all(r.status == 200 for r in turns), [(r.status, r.body[:300]) for r in turns if r.status != 200]
    assert turns[0].json.get("generate") is False  # the prewarm
    assert [last_log_read(r.json) for r in turns][-1] == LOGS
    # Two summaries, each made once riding the cache of the chain's history ...
    made = [r for r in requests if r.kind == "summarizer"]
    assert len(made) >= 2 and all(r.cached_tokens > 0.5 * r.prompt_tokens for r in made)
    # ... each forwarded once, unchained, as the whole history compacted ...
    whole = [i for i, r in enumerate(turns) if i and not r.json.get("previous_response_id")]
    summaries = [forwarded_summary(turns[i].json) for i in whole]
    assert len(whole) == len(made) and all(summaries) and len(set(summaries)) == len(made), whole
    assert first_log_kept(summaries[-1]) and TASK in summaries[-1]
    # ... and every other turn chained, with only what Codex added (the compacted history is the
    # upstream's from then on: the turn after a compaction reads it from the cache)
    chained = [r for i, r in enumerate(turns) if i and i not in whole]
    assert chained and all(r.json.get("previous_response_id") and len(r.json["input"]) <= 3 for r in chained)
    assert all(turns[i + 1].cached_tokens > 0.5 * turns[i + 1].prompt_tokens for i in whole if i + 1 < len(turns))
    assert "Traceback" not in proxy.log_text()
