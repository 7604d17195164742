"""The task the real agents' end-to-end tests give (test_e2e_claude_code.py, test_e2e_codex.py):
read fourteen build logs one by one with the agent's own tool, then say so. The fake upstream
plays the model: it asks for the log after the newest one the request shows, then answers. Each
log is ~2.5k tokens with identifiers and an error line a summary must keep, so the history
outgrows a 30k window and is summarized twice."""

from __future__ import annotations

import re
from pathlib import Path

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
