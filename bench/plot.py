"""Plot added latency and CPU per request against history length from a bench/run.py result.

    python bench/plot.py [RESULTS.json] [--out docs/perf-latency-vs-history.png]

Reads the growing-conversation workload (`long_conv`) of bench/results/latest.json by default.
matplotlib is optional (`pip install -e '.[bench]'`): without it this says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_IN = BENCH_DIR / "results" / "latest.json"
DEFAULT_OUT = BENCH_DIR.parent / "docs" / "perf-latency-vs-history.png"
STYLES = {"baseline": ("bare aiohttp forwarder", "tab:blue"), "nginx": ("nginx", "tab:green"),
          "proxy": ("compaction-proxy", "tab:red")}


def series(doc: dict[str, Any]) -> tuple[list[float], dict[str, list[float]], dict[str, list[float]]]:
    """History tokens per bucket, and per target its added p50 latency and CPU per request (ms)."""
    buckets = doc["workloads"]["long_conv"]["buckets"]
    tokens = [b["tokens"] or 0.0 for b in buckets]
    added: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for name in STYLES:
        rows = [b["targets"].get(name) for b in buckets]
        if all(rows):
            added[name] = [r["added_p50_ms"] for r in rows]
            cpu[name] = [r["cpu_ms_per_req"] for r in rows]
    return tokens, added, cpu


def plot(doc: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tokens, added, cpu = series(doc)
    ktokens = [t / 1000 for t in tokens]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, values in added.items():
        label, color = STYLES[name]
        ax1.plot(ktokens, values, marker="o", label=label, color=color)
        ax2.plot(ktokens, cpu[name], marker="o", label=label, color=color)
    ax1.set(title="Added median latency vs direct", xlabel="history (k tokens)", ylabel="ms")
    ax2.set(title="Server CPU time per request", xlabel="history (k tokens)", ylabel="ms")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend()
    meta = doc["meta"]
    fig.suptitle(f"Growing conversation, one client, {meta['cpus']} CPUs ({meta['time'][:10]}, commit {meta['commit']})")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Plot latency and CPU against history length.")
    p.add_argument("results", nargs="?", type=Path, default=DEFAULT_IN)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plot: matplotlib is not installed (pip install -e '.[bench]'); no plot written")
        return 0
    doc = json.loads(args.results.read_text())
    if "long_conv" not in doc.get("workloads", {}):
        print(f"plot: {args.results} has no long_conv workload (run bench/run.py without --only)", file=sys.stderr)
        return 1
    plot(doc, args.out)
    print(f"plot: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
