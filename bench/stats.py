"""Summing runs per workload and target, and turning them into the figures the table shows."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from bench.loadgen import LoadResult, Result, percentile

DIRECT, BASELINE, NGINX, PROXY = "direct", "baseline", "nginx", "proxy"
NO_METRICS = "nometrics"  # the proxy with metrics.enabled false (bench/run.py --compare-metrics)
NO_OPS = "noops"  # ... and server.access_log false too: the whole operator's view off


@dataclass
class Tally:
    """One workload x target, summed over the interleaved rounds."""

    results: list[Result] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0  # the target's server process (the fake upstream itself for `direct`)
    upstream_cpu_s: float = 0.0  # the fake upstream's, for every target
    faults: int = 0  # the server process's minor page faults
    round_cpu_ms: list[float] = field(default_factory=list)  # CPU per request of each measured round

    def add(self, load: LoadResult, cpu_s: float, upstream_cpu_s: float, faults: int = 0) -> None:
        if load.results:
            self.round_cpu_ms.append(cpu_s * 1000 / len(load.results))
        self.results += load.results
        self.wall_s += load.wall_s
        self.cpu_s += cpu_s
        self.upstream_cpu_s += upstream_cpu_s
        self.faults += faults

    def merge(self, other: "Tally") -> None:
        self.results += other.results
        self.wall_s += other.wall_s
        self.cpu_s += other.cpu_s
        self.upstream_cpu_s += other.upstream_cpu_s
        self.faults += other.faults
        self.round_cpu_ms += other.round_cpu_ms

    def values(self, metric: str) -> list[float]:
        return [getattr(r, metric) for r in self.results]

    def p(self, metric: str, pct: float) -> float:
        """Percentile of `metric` ("latency" or "ttfb") in milliseconds."""
        return percentile(self.values(metric), pct) * 1000

    @property
    def n(self) -> int:
        return len(self.results)

    @property
    def cpu_ms(self) -> float:
        return self.cpu_s * 1000 / self.n if self.n else 0.0

    @property
    def throughput(self) -> float:
        return self.n / self.wall_s if self.wall_s else 0.0

    def statuses(self) -> dict[str, int]:
        return dict(Counter(r.headers.get("x-compaction-status", "-") for r in self.results))

    def header_mean(self, name: str) -> float | None:
        vals = [float(r.headers[name]) for r in self.results if name in r.headers]
        return sum(vals) / len(vals) if vals else None


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


PAIRED_ROUNDS = 3  # fewer rounds than this and the ratio is of the sums


def cpu_ratio(t: Tally, base: Tally) -> float | None:
    """CPU per request against the baseline's: the median of the per-round ratios when both ran
    the same rounds (each round runs every target back to back, so a round is a pair measured under
    the same conditions; a burst of load from elsewhere on the host, which inflates whichever target
    it lands on, moves the median of the pairs little and the ratio of the sums a lot), else the
    ratio of the sums."""
    if len(t.round_cpu_ms) == len(base.round_cpu_ms) >= PAIRED_ROUNDS and all(b > 0 for b in base.round_cpu_ms):
        return median(a / b for a, b in zip(t.round_cpu_ms, base.round_cpu_ms))
    return _ratio(t.cpu_ms, base.cpu_ms)


def summarize(tallies: dict[str, Tally], metric: str = "latency") -> dict[str, dict[str, Any]]:
    """Per target: percentiles, added latency vs direct, throughput, CPU/req and ratios to baseline."""
    direct = tallies.get(DIRECT)
    out: dict[str, dict[str, Any]] = {}
    for name, t in tallies.items():
        if not t.n:
            continue
        row: dict[str, Any] = {
            "n": t.n,
            "p50_ms": t.p(metric, 50),
            "p99_ms": t.p(metric, 99),
            "throughput_rps": t.throughput,
            "cpu_ms_per_req": t.cpu_ms,
            "upstream_cpu_ms_per_req": t.upstream_cpu_s * 1000 / t.n,
            "faults_per_req": t.faults / t.n,
            "statuses": t.statuses(),
        }
        if metric != "latency":
            row["latency_p50_ms"] = t.p("latency", 50)
        if direct is not None and direct.n:
            row["added_p50_ms"] = row["p50_ms"] - direct.p(metric, 50)
            row["added_p99_ms"] = row["p99_ms"] - direct.p(metric, 99)
            row["throughput_vs_direct"] = _ratio(t.throughput, direct.throughput)
        out[name] = row
    base = out.get(BASELINE)
    for name, row in out.items():
        if base is None or name in (DIRECT, BASELINE):
            continue
        row["cpu_vs_baseline"] = cpu_ratio(tallies[name], tallies[BASELINE])
        row["cpu_vs_baseline_of_sums"] = _ratio(row["cpu_ms_per_req"], base["cpu_ms_per_req"])
        row["added_p50_vs_baseline"] = _ratio(row.get("added_p50_ms"), base.get("added_p50_ms"))
    return out
