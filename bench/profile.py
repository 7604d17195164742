"""Sampling the proxy with py-spy while a workload runs, and the functions that cost the most.

`bench/run.py --profile` attaches `py-spy record` (raw collapsed stacks, on-CPU samples only,
non-blocking so the proxy is not paused) to the proxy process for the measured part of each
workload (warm-ups excluded) and writes
bench/results/profile-<workload>.txt; `top_functions` ranks functions by the share of samples
they are on (self) or under (inclusive).
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^():]+)(?::\d+)?\)$")


def py_spy() -> str | None:
    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.exists() else shutil.which("py-spy")


class Profiler:
    """Records a process with py-spy from `start()` until `stop()`."""

    def __init__(self, pid: int, out: Path, *, rate: int = 400) -> None:
        self.pid = pid
        self.out = out
        self.rate = rate
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None

    def start(self) -> None:
        binary = py_spy()
        if binary is None:
            raise RuntimeError("py-spy is not installed (pip install py-spy)")
        self.proc = subprocess.Popen(
            [binary, "record", "--pid", str(self.pid), "--rate", str(self.rate), "--format", "raw",
             "--output", str(self.out), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # attaching takes a moment; samples before it would be lost anyway

    def stop(self) -> bool:
        """Stop recording; True when a profile was written."""
        if self.proc is None:
            return False
        self.proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        return self.out.exists()


def _label(frame: str) -> str:
    """`function (path/to/file.py:12)` -> `file.py:function`, with the package dir for our code."""
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = Path(m["file"])
    parent = path.parent.name
    short = f"{parent}/{path.name}" if parent in ("proxy", "compaction", "toolresults", "store", "web", "aiohttp") else path.name
    return f"{short}:{m['func']}"


def top_functions(path: Path, n: int = 15) -> dict[str, object]:
    """The `n` functions with the most samples, self and inclusive, as shares of all samples."""
    self_counts: Counter[str] = Counter()
    incl_counts: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [_label(f) for f in stack.split(";") if f and not f.startswith("process ") and not f.startswith("thread ")]
        if not frames:
            continue
        c = int(count)
        total += c
        self_counts[frames[-1]] += c
        for f in set(frames):
            incl_counts[f] += c
    share = lambda counter: [(f, round(100 * k / total, 1)) for f, k in counter.most_common(n)]  # noqa: E731
    return {"samples": total, "self_pct": share(self_counts) if total else [], "inclusive_pct": share(incl_counts) if total else []}
