"""`compaction-proxy demo`: watch the proxy compact a long agent session, with no key and no network.

Everything runs in this process, on 127.0.0.1: the packaged fake OpenAI upstream
(proxy/fakes/chat/server.py, the one the tests use), the proxy itself with a small window, and a
scripted coding agent that drives both with plain Chat Completions requests (aiohttp, which the
proxy has anyway: the demo works from a plain install). The agent asks, the fake
model answers with a tool call, the agent runs the "tool" (a canned, realistic output) and sends
the result back, turn after turn, so the history grows the way a real agent's does. Each request
prints its compaction status and token counts; a new summary is printed when it first goes
upstream; totals at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import aiohttp
from aiohttp import web

LOOPBACK = "127.0.0.1"
MODEL = "demo-agent"
WINDOW = 6000  # small, so the session compacts every few turns
TOOL_THRESHOLD = 1200  # tool outputs above this become notes
DEFAULT_TURNS = 16
SUMMARY_LINES = 14  # of each new summary, printed

_STEP_RE = re.compile(r"\[step (\d+)\]")
_STEP_LINE_RE = re.compile(r"\[User\]:\s*\[step (\d+)\] ([^\n]*)")
_DONE_RE = re.compile(r"- \[x\] step (\d+): ([^\n]*)")
_SUMMARY_RE = re.compile(r"<summary>\n(.*?)\n</summary>", re.DOTALL)
Print = Callable[[str], None]

_TASKS = [
    ("Find why test_parse_dates fails", "pytest tests/test_dates.py -x"),
    ("Look at the date parser", "sed -n 1,80p src/calendar_app/dates.py"),
    ("Check which callers pass naive datetimes", "grep -rn 'parse_date(' src/"),
    ("Run the whole suite to see what else breaks", "pytest -q"),
    ("Fix the timezone handling in parse_date", "apply_patch src/calendar_app/dates.py"),
    ("Re-run the failing test", "pytest tests/test_dates.py -x"),
    ("Check the changelog format", "sed -n 1,40p CHANGELOG.md"),
    ("Add a changelog entry", "apply_patch CHANGELOG.md"),
    ("Look for other naive datetime uses", "grep -rn 'datetime.now()' src/"),
    ("Fix the scheduler's naive datetime", "apply_patch src/calendar_app/scheduler.py"),
    ("Run the scheduler tests", "pytest tests/test_scheduler.py -q"),
    ("Check the CI config for the Python versions", "cat .github/workflows/ci.yml"),
    ("Run the linters", "ruff check src tests"),
    ("Fix the lint warning", "apply_patch src/calendar_app/scheduler.py"),
    ("Run the whole suite again", "pytest -q"),
    ("Write the pull request description", "git diff --stat"),
]


def _lines(seed: str, n: int, fmt: Callable[[int, str], str]) -> str:
    out = []
    for i in range(n):
        h = hashlib.sha256(f"{seed}:{i}".encode()).hexdigest()
        out.append(fmt(i, h))
    return "\n".join(out)


def tool_output(step: int, command: str) -> str:
    """A canned, deterministic output for the agent's command (paths, line numbers, hashes)."""
    if command.startswith("pytest"):
        n = 160 if command == "pytest -q" and step == 4 else 40  # one very long run: a tool note
        body = _lines(f"{step}{command}", n, lambda i, h: (
            f"tests/test_{['dates', 'scheduler', 'export', 'sync'][i % 4]}.py::test_case_{h[:6]} "
            f"{'FAILED' if i % 9 == 4 else 'PASSED'} [{(i + 1) * 100 // n:3d}%]"))
        failed = body.count("FAILED")
        return (f"$ {command}\n{body}\nE   AssertionError: expected 2024-03-10T02:30:00+00:00, got naive datetime\n"
                f"src/calendar_app/dates.py:47: AssertionError\n== {failed} failed, {n - failed} passed in 3.2{step}s ==")
    if command.startswith("grep"):
        return f"$ {command}\n" + _lines(f"{step}", 24, lambda i, h: (
            f"src/calendar_app/{['dates', 'scheduler', 'export', 'sync'][i % 4]}.py:{int(h[:3], 16) % 400 + 1}:"
            f"    when = parse_date(row['{h[:5]}'])  # {h[5:13]}"))
    if command.startswith("apply_patch"):
        path = command.split()[1]
        return (f"$ {command}\npatched {path}: 1 hunk, +6 -2\n"
                f"--- a/{path}\n+++ b/{path}\n@@ -44,7 +44,11 @@\n-    return datetime.strptime(text, FMT)\n"
                f"+    value = datetime.strptime(text, FMT)\n+    if value.tzinfo is None:\n"
                f"+        value = value.replace(tzinfo=timezone.utc)\n+    return value\n")
    return f"$ {command}\n" + _lines(f"{step}{command}", 30, lambda i, h: (
        f"{i + 1:4d}  {['def', 'class', 'return', 'import', '#', 'if'][i % 6]} item_{h[:8]} = {int(h[8:12], 16)}"))


class ScriptedModel:
    """The fake upstream's model: a tool call when the last message is the user's, an answer
    after a tool result. Stateless: everything it needs is in the request, as with a real model."""

    def __call__(self, body: dict[str, Any]) -> Any:
        messages = body["messages"]
        # The latest step named in a user message (older ones may be inside a summary by now).
        step = max((int(n) for m in messages if m.get("role") == "user"
                    for n in _STEP_RE.findall(str(m.get("content")))), default=1)
        _, command = _TASKS[(step - 1) % len(_TASKS)]
        if messages[-1].get("role") == "tool":
            return f"Step {step} done: `{command}` ran; next I will continue with the plan."
        return {"content": None, "tool_calls": [
            {"id": f"call_{step:03d}", "function": {"name": "shell", "arguments": {"command": command}}}]}


class ScriptedSummarizer:
    """The fake model's summaries: what a careful model keeps of this session (the request in
    progress, the steps done, a previous summary's steps carried forward). The proxy adds its own
    lists (files touched, identifiers) after it, as it does for any model.

    It reads either form of the ask: the transcript (`<conversation>` in the last message), or the
    call that rides the prompt cache, where the conversation is the request's own messages before
    the closing instruction (as a model would read them)."""

    def __call__(self, body: dict[str, Any]) -> str:
        messages = body["messages"]
        text = str(messages[-1].get("content"))
        if "<conversation>" in text:
            convo = text.split("</conversation>", 1)[0]
            previous = text.split("<previous-summary>", 1)[1] if "<previous-summary>" in text else ""
        else:
            earlier = [m for m in messages[:-1] if m.get("role") == "user"]
            convo = "\n".join(f"[User]: {m.get('content')}" for m in earlier)
            previous = "\n".join(str(m.get("content")) for m in earlier if _SUMMARY_RE.search(str(m.get("content"))))
        steps = {int(n): task.strip() for n, task in _STEP_LINE_RE.findall(convo)}
        steps.update({int(n): task.strip() for n, task in _DONE_RE.findall(previous)})
        return _summary(steps)


def _summary(steps: dict[int, str]) -> str:
    if not steps:
        return "## Active Task\n(nothing yet)\n"
    last = max(steps)
    done = "\n".join(f"- [x] step {n}: {steps[n]}" for n in sorted(steps) if n != last)
    return (f"## Active Task\n[step {last}] {steps[last]}\n\n"
            "## Goal\nFix the timezone handling of calendar-app's dates and land the change.\n\n"
            f"## Progress\n### Done\n{done or '- (none yet)'}\n\n### In Progress\n- [ ] step {last}\n\n"
            f"## Next Steps\n1. Finish step {last}, then go on with the plan.\n")


@dataclass
class Totals:
    requests: int = 0
    sent: int = 0  # tokens the agent sent
    forwarded: int = 0  # tokens the upstream got
    statuses: dict[str, int] = field(default_factory=dict)
    tool_notes: int = 0
    wait_ms: int = 0


SYSTEM = ("You are a coding agent working in the calendar-app repository. Use the shell tool, one "
          "command at a time, and report what you found.")
TOOLS = [{"type": "function", "function": {
    "name": "shell", "description": "Run a shell command in the repository",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


async def run(turns: int = DEFAULT_TURNS, out: Print = print) -> Totals:
    from proxy.fakes.chat import FakeUpstream
    from proxy.state import STATE

    totals = Totals()
    async with FakeUpstream(reply=ScriptedModel(), summarizer=ScriptedSummarizer(), window=WINDOW) as fake:
        cfg = _config(fake.base_url)
        runner, proxy_url = await _start_proxy(cfg)
        _print_head(out, proxy_url, fake.base_url, cfg_threshold(cfg))
        client = aiohttp.ClientSession(headers={"Authorization": "Bearer sk-demo-no-key-needed"},
                                       timeout=aiohttp.ClientTimeout(total=60))
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
        shown: set[str] = set()
        try:
            for step in range(1, turns + 1):
                await _turn(client, proxy_url, messages, step, lambda h: _report(out, totals, step, h, fake, shown))
                await runner.app[STATE].compaction.idle()  # the agent's think time: a background summary gets its turn
        finally:
            await client.close()
            await runner.cleanup()
        _print_totals(out, totals, len(fake.history_summarizer_requests), len(fake.tool_summarizer_requests))
    return totals


def _config(upstream_url: str) -> Any:
    from proxy.config import Config

    return Config.model_validate({
        "server": {"host": LOOPBACK, "port": 0},
        "upstream": {"base_url": upstream_url},
        "models": {MODEL: {"context_window": WINDOW}},
        "tool_results": {"threshold_tokens": TOOL_THRESHOLD},
        "store": {"url": "memory://"},
    })


async def _start_proxy(cfg: Any) -> tuple[web.AppRunner, str]:
    """The proxy's app on a free loopback port: its runner and its base URL."""
    from proxy.app import create_app

    runner = web.AppRunner(create_app(cfg), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, LOOPBACK, 0)
    await site.start()
    return runner, f"http://{LOOPBACK}:{runner.addresses[0][1]}/v1"


async def _turn(client: aiohttp.ClientSession, proxy_url: str, messages: list[dict[str, Any]], step: int,
                report: Callable[[Any], None]) -> None:
    """One step of the agent: the user's ask, the model's tool call and its result, the answer."""
    task, _ = _TASKS[(step - 1) % len(_TASKS)]
    messages.append({"role": "user", "content": f"[step {step}] {task}."})
    for _ in range(2):  # the tool call, then the answer after its result
        headers, reply = await _chat(client, proxy_url, messages, TOOLS)
        report(headers)
        if not reply.get("tool_calls"):
            messages.append({"role": "assistant", "content": reply["content"]})
            return
        call = reply["tool_calls"][0]
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        command = json.loads(call["function"]["arguments"])["command"]
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": tool_output(step, command)})


def _print_head(out: Print, proxy_url: str, fake_url: str, threshold: int) -> None:
    out(f"compaction-proxy demo: agent -> proxy {proxy_url} -> fake upstream {fake_url}")
    out(f"model {MODEL}: window {WINDOW} tokens, compaction above {threshold}, tool outputs above "
        f"{TOOL_THRESHOLD} tokens become notes; no key, nothing leaves {LOOPBACK}\n")
    out(f"{'turn':>4} {'req':>3}  {'status':<11} {'tokens before -> after':>22}  {'wait ms':>7}  note")


def _print_totals(out: Print, totals: Totals, summaries: int, tool_calls: int) -> None:
    saved = 100 * (1 - totals.forwarded / totals.sent) if totals.sent else 0.0
    out("")
    out(f"totals: {totals.requests} requests; " + ", ".join(f"{k} {v}" for k, v in sorted(totals.statuses.items())))
    out(f"        the agent sent {totals.sent} tokens, the upstream received {totals.forwarded} ({saved:.0f}% less)")
    out(f"        {summaries} history summarizer calls, {tool_calls} tool-result notes "
        f"({totals.tool_notes} requests carried one), {totals.wait_ms} ms spent waiting on summaries")


async def _chat(client: aiohttp.ClientSession, base_url: str, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]]) -> tuple[Any, dict[str, Any]]:
    """One Chat Completions request through the proxy: its answer's headers and message."""
    async with client.post(f"{base_url}/chat/completions", json={"model": MODEL, "messages": messages,
                                                                 "tools": tools}) as resp:
        body = await resp.json()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {body}")
        return resp.headers, body["choices"][0]["message"]


def cfg_threshold(cfg: Any) -> int:
    from proxy.compaction.budget import Budget

    c = cfg.compaction
    return Budget.for_model(cfg.context_window(MODEL), threshold_tokens=c.threshold_tokens,
                            threshold_percent=c.threshold_percent, reserve_tokens=c.reserve_tokens,
                            keep_recent_tokens=c.keep_recent_tokens).threshold


def _report(out: Print, totals: Totals, step: int, headers: Any, fake: Any, shown: set[str]) -> None:
    status = headers["x-compaction-status"]
    before, after = int(headers["x-compaction-tokens-before"]), int(headers["x-compaction-tokens-after"])
    notes, wait = int(headers["x-compaction-tool-results"]), int(headers["x-compaction-wait-ms"])
    totals.requests += 1
    totals.sent += before
    totals.forwarded += after
    totals.statuses[status] = totals.statuses.get(status, 0) + 1
    totals.tool_notes += notes > 0
    totals.wait_ms += wait
    note = f"{notes} tool result(s) as notes" if notes else ""
    out(f"{step:>4} {totals.requests:>3}  {status:<11} {before:>10} -> {after:<9}  {wait:>7}  {note}".rstrip())
    if status == "summarized":
        summary = _forwarded_summary(fake.chat_requests[-1]["messages"])
        if summary and summary not in shown:
            shown.add(summary)
            lines = summary.splitlines()
            out(f"           new summary ({len(lines)} lines), as the upstream got it:")
            for line in _shown_lines(lines):
                out(f"           | {line[:100]}{' ...' if len(line) > 100 else ''}")


def _shown_lines(lines: list[str]) -> list[str]:
    """A summary's first lines, and the identifiers the proxy's code kept (their heading and first
    line), with what is left out counted."""
    shown = lines[:SUMMARY_LINES]
    at = next((i for i, x in enumerate(lines) if x.startswith("## Identifiers")), None)
    if at is None or at < SUMMARY_LINES:
        return shown + ([f"... {len(lines) - SUMMARY_LINES} more lines"] if len(lines) > SUMMARY_LINES else [])
    ids = lines[at:at + 2]
    return shown + [f"... {at - SUMMARY_LINES} more lines", *ids] + (
        [f"... {len(lines) - at - 2} more lines"] if len(lines) > at + 2 else [])


def _forwarded_summary(messages: list[dict[str, Any]]) -> str | None:
    for m in messages:
        content = m.get("content")
        if m.get("role") == "user" and isinstance(content, str) and (found := _SUMMARY_RE.search(content)):
            return found.group(1)
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="compaction-proxy demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=DEFAULT_TURNS, help=f"agent turns to play (default {DEFAULT_TURNS})")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    totals = asyncio.run(run(max(1, args.turns)))
    return 0 if totals.requests else 1
