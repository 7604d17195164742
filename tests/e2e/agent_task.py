"""The task the real agents' end-to-end tests give (test_e2e_claude_code.py, test_e2e_codex.py):
read fourteen build logs one by one with the agent's own tool, then say so. The fake upstream
plays the model: it asks for the log after the newest one the request shows, then answers. Each
log is ~2.5k tokens with identifiers and an error line a summary must keep, so the history
outgrows a 30k window and is summarized twice."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

LOGS = 14
TASK = "Read the build logs one by one and tell me when all are read."
DONE = "All fourteen logs are read."
WINDOW = 30000  # the window the proxy is told the agent's model has
_HEADER = re.compile(r"LOG FILE (\d+) of")


def write_logs(root: Path) -> list[Path]:
    paths = []
    for k in range(1, LOGS + 1):
        lines = [f"LOG FILE {k} of {LOGS}"]
        lines += [f"step {i:03d}: compiled src/pkg{k}/mod_{i:03d}.py in {(i * 7 + k) % 97} ms" for i in range(110)]
        lines.append(f"ERROR E{k}0{k}7: test_ledger_{k} failed at src/pkg{k}/ledger.py:{40 + k}")
        path = root / f"build-{k}.log"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def newest_log(text: str) -> int:
    """The newest log a tool output shows (0: none)."""
    found = _HEADER.findall(text)
    return int(found[-1]) if found else 0


def first_log_kept(summary: str) -> bool:
    """Whether a summary still names the first log and carries its error line."""
    return "build-1.log" in summary and "ERROR E1017: test_ledger_1 failed" in summary


def compacted_twice(requests: list[Any], calls: list[Any], summary_of: Callable[[Any], str | None]) -> list[str]:
    """Check what the fake saw of a session: the history summarized twice, each summary made once
    riding the cache of what the agent had sent, and reused byte for byte until the next folded
    it in (the newest may come with the last request); the last still names the first log, its
    error line and the task. `summary_of(body)`: the summary a forwarded body carries, if any.
    Returns the summaries the forwarded requests carried, in order."""
    kinds = [r.kind for r in requests]
    made = [r for r in requests if r.kind == "summarizer"]
    assert len(made) >= 2, kinds
    assert all(r.cached_tokens > 0.5 * r.prompt_tokens for r in made)  # read from the prompt cache
    summaries = [s for s in (summary_of(r.json) for r in calls) if s]
    assert len(set(summaries)) == len(made), kinds  # one summary a call, each then reused
    assert all(summaries.count(s) >= 2 for s in set(summaries) - {summaries[-1]})
    # what code writes into it holds with a real agent's shapes: the file its calls named, the
    # first log's error line, the user's task verbatim
    assert first_log_kept(summaries[-1]) and TASK in summaries[-1]
    return summaries
