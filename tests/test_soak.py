"""The soak in its short form (issue 7 item 7): `scripts/soak` against the real proxy process, with
CI's budget: 8 seconds, 16 clients, and on past them until 200 requests were sent (a loaded machine).
The full run (5 minutes, 64 clients) is `scripts/soak`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parents[1] / "scripts" / "soak"


def test_short_soak_passes_with_every_kind_of_request():
    run = subprocess.run([sys.executable, str(SOAK), "--duration", "8", "--clients", "16", "--warmup", "2",
                          "--min-requests", "200"],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(run.stdout)
    assert result["ok"] and result["failures"] == 0
    assert result["requests"] >= 200  # the load was real, not a few requests
    assert set(result["by_kind"]) == {"growing", "tool_result", "short", "passthrough", "upstream_fails", "abandon",
                                      "bypass", "stall", "websocket"}
    # Responses WebSockets in the mix: turns answered, sockets left idle closed by the proxy (1001)
    assert result["websocket_turns"] > 0 and result["websockets_closed_idle"] > 0
    assert {"summarized", "reused", "none", "bypassed"} <= set(result["compaction_status"])
    assert result["failed_by_the_upstream_on_purpose"] > 0 and result["streams_abandoned_by_the_client"] > 0
    assert result["stalled_upstream_answered_504"] > 0
    assert result["fds"]["after_load"] <= result["fds"]["idle"] + 4
    assert result["tasks"]["after_load"] <= result["tasks"]["idle"] + 4


def test_soak_refuses_bad_arguments():
    run = subprocess.run([sys.executable, str(SOAK), "--duration", "1"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--duration" in run.stderr


def test_soak_fails_on_a_leak_or_an_unexpected_failure(monkeypatch):
    """The verdict itself: each check can say no."""
    import importlib.util
    from importlib.machinery import SourceFileLoader

    loader = SourceFileLoader("soak", str(SOAK))
    spec = importlib.util.spec_from_loader("soak", loader)
    assert spec is not None
    soak = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "soak", soak)  # its dataclasses look their module up there
    loader.exec_module(soak)
    args = soak.parse_args(["--duration", "60"])
    idle, warm = soak.Sample(0, 100.0, 20, 6), soak.Sample(1, 150.0, 60, 40)

    def verdict(end_rss: float = 160.0, after_fds: int = 20, after_tasks: int = 6, failures: tuple = ()) -> dict:
        tally = soak.Tally(failures=list(failures))
        end, after = soak.Sample(2, end_rss, 60, 40), soak.Sample(3, end_rss, after_fds, after_tasks)
        return soak.report(args, tally, idle, warm, end, after, [warm, end], 60.0)

    assert verdict()["ok"]
    assert not verdict(end_rss=150 * 1.25 + 48 + 1)["ok"]  # RSS beyond the margin
    assert not verdict(after_fds=20 + 5)["ok"]  # descriptors not back to idle
    assert not verdict(after_tasks=6 + 5)["ok"]  # tasks not back to idle
    assert not verdict(failures=("client 1 growing: HTTP 500",))["ok"]
