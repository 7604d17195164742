"""The real Gemini CLI through the proxy: `gemini -p` runs the task of agent_task.py with its own
tools (read_file on the odd logs, run_shell_command running `cat` on the even ones) over the Gemini
API (`GOOGLE_GEMINI_BASE_URL`, the key in `GEMINI_API_KEY`), against the strict fake Gemini
upstream, which plays a Gemini 3 model: its function calls carry thought signatures bound to the
prefix they were made under.

What Gemini CLI sends is what it sends (docs/clients.md § Gemini CLI): `:streamGenerateContent?alt=sse`
under /v1beta, the key as `x-goog-api-key`, its system instruction (with a role), ~15 function
declarations with `parametersJsonSchema`, `generationConfig.thinkingConfig`, function calls and
responses with ids it makes up itself, the signatures as the model gave them. The proxy must
compact that history (older turns as a summary) without breaking it: every request reaches the
fake valid, and Gemini CLI finishes its task.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from proxy.fakes.gemini import FakeGemini, code_assist

from .agent_task import DONE, LOGS, TASK, WINDOW, compacted_twice, newest_log, write_logs

pytestmark = pytest.mark.e2e

MODEL = "gemini-3.1-pro-preview"  # Gemini CLI 0.61.0's default model (a signing one)
KEY = "AIza-e2e-gemini-cli-key"
# What keeps it on loopback and non-interactive: the API-key auth chosen (GOOGLE_GEMINI_BASE_URL alone
# selects a "gateway" auth that `-p` refuses: "Invalid auth method selected."), no usage statistics
# (sent to play.googleapis.com, and an x-gemini-api-privileged-user-id header on every request), no
# update check.
QUIET = {"privacy": {"usageStatisticsEnabled": False}, "telemetry": {"enabled": False},
         "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False}}
SETTINGS = {**QUIET, "security": {"auth": {"selectedType": "gemini-api-key"}}}


def last_log_read(body: dict[str, Any]) -> int:
    """Which log the newest function response of the request shows (0: none yet). The forwarded
    body may be compacted, so only its newest content is read."""
    responses = [p["functionResponse"] for p in body["contents"][-1]["parts"] if "functionResponse" in p]
    return newest_log(json.dumps(responses)) if responses else 0


def agent(logs: list[Path]):
    def reply(view: dict[str, Any]) -> Any:
        done = last_log_read(view["raw"])
        if done >= len(logs):
            return DONE
        path = str(logs[done])
        call = {"name": "read_file", "input": {"file_path": path}} if done % 2 == 0 else \
            {"name": "run_shell_command", "input": {"command": f"cat {path}", "description": "Show the log"}}
        return {"content": f"Reading log {done + 1}.", "tool_uses": [call]}
    return reply


def routed(reply, verdict: str):
    """`reply`, with Gemini CLI's routing call (its classifier's system instruction) answered by
    `verdict`, the JSON its schema asks for."""
    def answer(view: dict[str, Any]) -> Any:
        return verdict if "Task Routing AI" in json.dumps(view["messages"][:1]) else reply(view)
    return answer


def forwarded_summary(body: dict[str, Any]) -> str | None:
    first = body["contents"][0]
    text = "".join(p.get("text", "") for p in first["parts"]) if first.get("role") == "user" else ""
    return text if "<summary>" in text else None


def setup(tmp_path: Path, settings: dict[str, Any]) -> tuple[list[Path], Path, Path]:
    """The logs in a work directory, and a home whose ~/.gemini/settings.json is `settings`."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    (home / ".gemini").mkdir(parents=True)
    (home / ".gemini" / "settings.json").write_text(json.dumps(settings))
    return write_logs(work), work, home


def cli_args(model: str | None = MODEL) -> list[str]:
    return [*(["-m", model] if model else []), "-p", TASK, "--yolo", "--skip-trust", "--output-format", "json"]


def finished(run: subprocess.CompletedProcess[str], requests: list[Any]) -> list[Any]:
    """Gemini CLI said it is done after reading every log; the fake refused nothing, and saw
    nothing but the model's calls and the proxy's summaries. Returns the model calls."""
    calls = [r for r in requests if r.kind == "gemini"]
    seen = [(r.kind, r.path, r.status) for r in requests]
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:], seen)
    assert json.loads(run.stdout)["response"] == DONE, run.stdout[-2000:]
    assert {r.kind for r in requests} == {"gemini", "summarizer"}, seen
    assert all(r.status == 200 for r in requests), [(r.status, r.body[:300]) for r in requests if r.status != 200]
    assert [last_log_read(r.json) for r in calls][-1] == LOGS
    return calls


def test_gemini_cli_finishes_a_task_the_proxy_compacts_along_the_way(gemini_cli: Path, start_proxy, tmp_path: Path):
    logs, work, home = setup(tmp_path, SETTINGS)
    with FakeGemini() as fake:
        fake.reply = agent(logs)
        proxy = start_proxy(gemini={"base_url": fake.base_url}, upstream={"base_url": fake.base_url},
                            models={MODEL: {"context_window": WINDOW}}, compaction={"prepare_percent": 0})
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
               "GOOGLE_GEMINI_BASE_URL": proxy.url, "GEMINI_API_KEY": KEY}
        run = subprocess.run([str(gemini_cli), *cli_args()], cwd=work, env=env, capture_output=True, text=True,
                             timeout=300)
        requests = list(fake.requests)
    calls = finished(run, requests)

    # Gemini CLI ran both its tools for real (the shell's output is wrapped in its own markers) ...
    names = [p["functionResponse"]["name"] for r in calls for p in r.json["contents"][-1]["parts"] if "functionResponse" in p]
    assert set(names) == {"read_file", "run_shell_command"}
    # ... in requests as it sends them, streamed, with its key, tools, thinking and signed calls
    assert all(r.path.endswith(f"/v1beta/models/{MODEL}:streamGenerateContent") for r in calls)
    assert all(r.headers["x-goog-api-key"] == KEY and r.query.get("alt") == "sse" for r in calls)
    assert all(r.json["generationConfig"]["thinkingConfig"] and r.json["systemInstruction"] for r in calls)
    declared = {f["name"] for f in calls[-1].json["tools"][0]["functionDeclarations"]}
    assert {"read_file", "run_shell_command"} <= declared
    assert all("thoughtSignature" in p for r in calls for c in r.json["contents"][-2:-1] for p in c["parts"]
               if "functionCall" in p)
    # and the proxy compacted that history twice
    compacted_twice(requests, calls, forwarded_summary)
    assert len(calls[-1].json["contents"]) < 1 + 2 * LOGS  # Gemini CLI's own: the task and two contents a log
    log = proxy.log_text()
    assert "Traceback" not in log and KEY not in log


def test_without_a_model_its_routing_call_goes_through_the_proxy_too(gemini_cli: Path, start_proxy, tmp_path: Path):
    """Gemini CLI's default model is "auto": each prompt is first classified by a small model
    (non-streamed generateContent, two user contents in a row, a JSON schema), whose score picks
    the model of the turn. That call is forwarded as any other, and the verdict is obeyed."""
    logs, work, home = setup(tmp_path, SETTINGS)
    verdict = '{"complexity_reasoning": "Reading files one by one is simple.", "complexity_score": 10}'
    with FakeGemini() as fake:
        fake.reply = routed(agent(logs[:2]), verdict)
        proxy = start_proxy(gemini={"base_url": fake.base_url}, upstream={"base_url": fake.base_url})
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
               "GOOGLE_GEMINI_BASE_URL": proxy.url, "GEMINI_API_KEY": KEY}
        run = subprocess.run([str(gemini_cli), *cli_args(None)], cwd=work, env=env, capture_output=True, text=True,
                             timeout=300)
        requests = list(fake.requests)
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:], [(r.path, r.status) for r in requests])
    router, *turns = requests
    assert router.path.endswith(":generateContent") and router.status == 200
    assert [c["role"] for c in router.json["contents"]] == ["user", "user"]
    assert router.json["generationConfig"]["responseMimeType"] == "application/json"
    chosen = {r.path.split("/")[-1].split(":")[0] for r in turns}
    assert len(chosen) == 1 and "lite" not in chosen.pop()  # the model its verdict picked, for every turn
    assert all(r.path.endswith(":streamGenerateContent") and r.status == 200 for r in turns)
    assert last_log_read(turns[-1].json) == 2 and json.loads(run.stdout)["response"] == DONE


# Signed in with Google: GOOGLE_GENAI_USE_GCA with GOOGLE_CLOUD_ACCESS_TOKEN has Gemini CLI take that
# token as its OAuth token (no login, no refresh); its one call elsewhere, the account's userinfo at
# www.googleapis.com, goes to a closed loopback port through HTTPS_PROXY and is skipped as it fails.
TOKEN = "ya29.e2e-fake-oauth-token"
# Asked for MODEL, Gemini CLI 0.61.0 on the fake's free Code Assist tier runs its turns on gemini-2.5-pro
# (and makes non-streamed generateContent calls to gemini-3.1-flash-lite besides them).
CODE_ASSIST_MODEL = "gemini-2.5-pro"
CODE_ASSIST_SETTINGS = {**QUIET, "security": {"auth": {"selectedType": "oauth-personal"}}}


CODE_ASSIST_ENV = {"GOOGLE_GENAI_USE_GCA": "true", "GOOGLE_CLOUD_ACCESS_TOKEN": TOKEN,
                   "HTTPS_PROXY": "http://127.0.0.1:9", "NO_PROXY": "127.0.0.1"}


def test_signed_in_with_google_its_code_assist_turns_are_compacted_too(gemini_cli: Path, start_proxy, tmp_path: Path):
    """The same task over Code Assist (`CODE_ASSIST_ENDPOINT`: `/v1internal:streamGenerateContent`,
    the request wrapped with the project its account setup named): compacted as the Gemini API,
    the proxy's summaries made as Code Assist calls under the same token and project."""
    logs, work, home = setup(tmp_path, CODE_ASSIST_SETTINGS)
    with FakeGemini() as fake:
        fake.reply = agent(logs)
        proxy = start_proxy(gemini={"base_url": fake.base_url, "code_assist_base_url": fake.base_url},
                            upstream={"base_url": fake.base_url}, models={CODE_ASSIST_MODEL: {"context_window": WINDOW}},
                            compaction={"prepare_percent": 0})
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "CODE_ASSIST_ENDPOINT": proxy.url,
               **CODE_ASSIST_ENV}
        run = subprocess.run([str(gemini_cli), *cli_args()], cwd=work, env=env, capture_output=True, text=True,
                             timeout=300)
        requests = list(fake.requests)
    code_assist_finished(run, requests)
    log = proxy.log_text()
    assert "Traceback" not in log and TOKEN not in log


def code_assist_finished(run: subprocess.CompletedProcess[str], requests: list[Any]) -> None:
    """Gemini CLI finished the task over Code Assist: its account calls relayed, its turns wrapped
    with its project and token and compacted twice, the proxy's summaries Code Assist calls."""
    account = [r for r in requests if r.kind == "other"]
    assert account and all(r.path.startswith("/v1internal:") and r.status == 200 for r in account)
    model = [r for r in requests if r.kind != "other"]
    finished(run, model)
    calls = [r for r in model if r.kind == "gemini" and r.wrapper["model"] == CODE_ASSIST_MODEL]
    assert all(r.path == "/v1internal:streamGenerateContent" and r.wrapper["project"] == code_assist.PROJECT
               for r in calls)
    assert all(r.headers["authorization"] == f"Bearer {TOKEN}" for r in model)
    assert all(r.path == "/v1internal:generateContent" for r in model if r.kind == "summarizer")
    compacted_twice(model, calls, forwarded_summary)
