"""`compaction-proxy demo`: exits 0, shows compaction at work, and talks to nothing but loopback.

The demo runs as its own process with an audit hook (sys.addaudithook) that records every socket
connect and every name lookup the process makes: it observes, it changes nothing.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.demo import _TASKS

RUN = r"""
import json, sys
sys.modules["openai"] = None  # not installed: the demo works after a plain `pip install`
seen = {"connect": [], "getaddrinfo": []}
def hook(event, args):
    if event == "socket.connect":
        seen["connect"].append(repr(args[1]))
    elif event == "socket.getaddrinfo":
        seen["getaddrinfo"].append(repr(args[0]))
sys.addaudithook(hook)
from proxy.cli import main
code = main(["demo"] + sys.argv[2:])
with open(sys.argv[1], "w") as f:
    json.dump(seen, f)
sys.exit(code)
"""

ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(none|masked|summarized|reused|degraded|failed-open)\s+(\d+) -> (\d+)\s+(\d+)")


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    seen = tmp_path_factory.mktemp("demo") / "sockets.json"
    proc = subprocess.run([sys.executable, "-c", RUN, str(seen)], capture_output=True, text=True, timeout=120)
    return proc, json.loads(seen.read_text()) if seen.exists() else {}


def test_exits_0_and_shows_summaries_made_and_reused(demo) -> None:
    proc, _ = demo
    assert proc.returncode == 0, proc.stderr
    rows = [ROW.match(line) for line in proc.stdout.splitlines()]
    rows = [m for m in rows if m]
    statuses = [m.group(3) for m in rows]
    assert "summarized" in statuses and "reused" in statuses, proc.stdout
    assert "failed-open" not in statuses
    for m in rows:  # a compacted request is smaller than what the agent sent
        if m.group(3) in ("masked", "summarized", "reused"):
            assert int(m.group(5)) < int(m.group(4))
    assert "new summary" in proc.stdout and "| ## Active Task" in proc.stdout
    totals = proc.stdout[proc.stdout.index("totals:"):]
    assert f"{len(rows)} requests" in totals and "reused" in totals
    assert "Traceback" not in proc.stderr and "WARNING" not in proc.stderr, proc.stderr


def test_its_summaries_carry_the_tasks_and_identifiers_of_the_session(demo) -> None:
    """The fake model writes its summary from the call that rides the prompt cache (the
    conversation's own messages), so each summary names the step in progress and the steps done,
    and the proxy's code adds the identifiers; none is the empty one."""
    proc, _ = demo
    summaries = proc.stdout.split("new summary")[1:]
    assert len(summaries) >= 2, proc.stdout
    tasks = [t for t, _ in _TASKS]
    for s in summaries:
        active = re.search(r"\| ## Active Task\n\s+\| \[step (\d+)\] ([^\n]*)\.\n", s)
        assert active is not None and active.group(2) in tasks, s
        assert "| - [x] step 1: Find why test_parse_dates fails." in s, s
        assert "(nothing yet)" not in s and "Goal\n           | - none recorded" not in s
        ids = re.search(r"\| ## Identifiers[^\n]*\n\s+\| - ([^\n]*)", s)
        assert ids is not None and len(re.findall(r"\b[0-9a-f]{8}\b", ids.group(1))) >= 3, s


def test_talks_only_to_loopback(demo) -> None:
    proc, seen = demo
    assert proc.returncode == 0, proc.stderr
    assert seen["connect"], "no connection recorded: the audit hook saw nothing"
    hosts = {re.match(r"\('([^']*)'", a).group(1) for a in seen["connect"]}
    assert hosts == {"127.0.0.1"}, seen["connect"]
    assert {a.strip("'") for a in seen["getaddrinfo"]} <= {"127.0.0.1"}, seen["getaddrinfo"]
