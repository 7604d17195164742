"""The printed report: one table for every workload, the long conversation by history length, idle
streams' memory, and the issue's targets with the measured values."""

from __future__ import annotations

from typing import Any

from bench.stats import BASELINE, DIRECT, NO_METRICS, NO_OPS, PROXY

COLUMNS = (
    ("workload", 16, "workload"),  # the longest name: responses_stream
    ("target", 9, "target"),
    ("n", 5, "n"),
    ("p50 ms", 8, "p50_ms"),
    ("p99 ms", 8, "p99_ms"),
    ("+p50 ms", 8, "added_p50_ms"),
    ("+p99 ms", 8, "added_p99_ms"),
    ("req/s", 7, "throughput_rps"),
    ("thr/direct", 10, "throughput_vs_direct"),
    ("CPU/req ms", 10, "cpu_ms_per_req"),
    ("CPU/base", 8, "cpu_vs_baseline"),
    ("+p50/base", 9, "added_p50_vs_baseline"),
)


def fmt(v: Any, width: int) -> str:
    if v is None:
        s = "-"
    elif isinstance(v, float):
        s = f"{v:.0f}" if abs(v) >= 1000 else f"{v:.2f}" if abs(v) < 100 else f"{v:.1f}"
    else:
        s = str(v)
    return s.rjust(width)


def _notes(row: dict[str, Any], target: str) -> str:
    parts = []
    if target == PROXY and row.get("statuses"):
        parts.append("status " + ",".join(f"{k}x{v}" for k, v in row["statuses"].items()))
    if "streams_missing_events" in row:
        parts.append(f"events {row['events_per_stream']}/stream, short {row['streams_missing_events']}, "
                     f"coalesced {row['coalesced_events_pct']:.1f}%")
    if row.get("faults_per_req", 0) >= 1:  # memory touched anew each request costs CPU (page faults)
        parts.append(f"faults {row['faults_per_req']:.0f}/req")
    if target == DIRECT:
        parts.append("CPU = fake upstream")
    return "; ".join(parts)


def main_table(workloads: dict[str, Any]) -> list[str]:
    head = " ".join(title.rjust(w) if i > 1 else title.ljust(w) for i, (title, w, _) in enumerate(COLUMNS)) + "  notes"
    lines = [head, "-" * len(head)]
    for name, wl in workloads.items():
        if wl.get("metric") in ("memory", "crossing", "stall"):
            continue
        for target, row in wl["targets"].items():
            cells = [name.ljust(COLUMNS[0][1]), target.ljust(COLUMNS[1][1])]
            cells += [fmt(row.get(key), w) for _, w, key in COLUMNS[2:]]
            lines.append(" ".join(cells) + "  " + _notes(row, target))
    return lines


def long_table(wl: dict[str, Any]) -> list[str]:
    names = [n for n in wl["targets"] if n != DIRECT]
    head = f"{'steps':>9} {'tokens':>8} {'body KiB':>9} {'direct p50':>10} " + " ".join(
        f"{'+p50 ' + n:>14} {'CPU/req ' + n:>16}" for n in names
    )
    lines = ["long_conv by history length (ms)", head]
    for b in wl["buckets"]:
        rows = b["targets"]
        cells = [f"{b['steps'][0]}-{b['steps'][1]}".rjust(9), fmt(b.get("tokens"), 8), fmt(b["body_kb"], 9),
                 fmt(rows.get(DIRECT, {}).get("p50_ms"), 10)]
        for n in names:
            cells += [fmt(rows.get(n, {}).get("added_p50_ms"), 14), fmt(rows.get(n, {}).get("cpu_ms_per_req"), 16)]
        lines.append(" ".join(cells))
    return lines


def memory_table(wl: dict[str, Any]) -> list[str]:
    lines = [f"memory: {wl['description']}",
             f"{'target':<9} {'RSS before MB':>13} {'RSS under MB':>12} {'peak MB':>8} {'KB/stream':>9} {'open s':>7}  upstream released"]
    for name, r in wl["targets"].items():
        lines.append(f"{name:<9} {fmt(r['rss_before_mb'], 13)} {fmt(r['rss_under_load_mb'], 12)} {fmt(r['rss_peak_mb'], 8)} "
                     f"{fmt(r['kb_per_stream'], 9)} {fmt(r['open_s'], 7)}  {'yes' if r['upstream_released'] else 'NO'}")
    return lines


def crossing_lines(description: str, row: dict[str, Any]) -> list[str]:
    lines = [f"crossing: {description}",
             f"{'turn':>5} {'status':<11} {'latency ms':>10} {'direct ms':>9} {'wait ms':>8}  tokens"]
    for e in row["events"]:
        lines.append(f"{e['turn']:>5} {e['status']:<11} {fmt(e['latency_ms'], 10)} {fmt(e['direct_ms'], 9)} "
                     f"{fmt(e['wait_ms'], 8)}  {e['tokens_before']} -> {e['tokens_after']}")
    return lines


def _row(results: dict[str, Any], workload: str, target: str) -> dict[str, Any]:
    return results.get(workload, {}).get("targets", {}).get(target, {})


def _check(text: str, value: float | None, limit: float | None, unit: str = "") -> dict[str, Any]:
    met = None if value is None or limit is None else value <= limit
    return {"target": text, "value": value, "limit": limit, "unit": unit, "met": met}


def check_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 6's targets with the values of this run (None: not measured in this run)."""
    out = [
        _check("1. small, 1 client: proxy CPU/req vs baseline", _row(results, "small_1", PROXY).get("cpu_vs_baseline"), 1.5, "x"),
        _check("1. small, 16 clients: proxy CPU/req vs baseline", _row(results, "small_16", PROXY).get("cpu_vs_baseline"), 1.5, "x"),
        _check("1. small, 1 client: proxy added p50", _row(results, "small_1", PROXY).get("added_p50_ms"), 1.5, "ms"),
    ]
    buckets = results.get("long_conv", {}).get("buckets", [])
    cpu = [b["targets"].get(PROXY, {}).get("cpu_ms_per_req") for b in buckets]
    cpu = [c for c in cpu if c is not None]
    out.append(_check("2. growing conversation: proxy CPU/req, worst bucket", max(cpu) if cpu else None, 3.0, "ms"))
    if len(cpu) >= 2:
        base = [b["targets"].get(BASELINE, {}).get("cpu_ms_per_req") or 0.0 for b in buckets]
        growth = _check("2. growing conversation: proxy CPU/req growth first->last bucket "
                        f"(baseline grows {base[-1] - base[0]:+.2f} ms)", cpu[-1] - cpu[0], None, "ms")
        out.append(growth)
    out.append(_check("3. reused summary, ~1M tokens: proxy added p50", _row(results, "reused", PROXY).get("added_p50_ms"), 30, "ms"))
    stream_proxy, stream_base = _row(results, "stream_8", PROXY), _row(results, "stream_8", BASELINE)
    ratio = None
    if stream_proxy.get("added_p50_ms") is not None and stream_base.get("added_p50_ms"):
        ratio = stream_proxy["added_p50_ms"] / stream_base["added_p50_ms"]
    out.append(_check("4. streaming: proxy added first-event p50 vs baseline's", ratio, 1.5, "x"))
    out.append(_check("4. streaming: proxy streams that lost events", stream_proxy.get("streams_missing_events"), 0))
    cross = results.get("crossing", {}).get("targets", {}).get(PROXY, {})
    out.append(_check("5. crossing the threshold with a prepared summary: worst x-compaction-wait-ms",
                      cross.get("max_wait_ms"), 50, "ms"))
    mem = results.get("memory", {}).get("targets", {}).get(PROXY, {})
    out.append(_check(f"6. {mem.get('streams', 1000)} idle streams: proxy RSS", mem.get("rss_under_load_mb"), 300, "MB"))
    return [{**c, "target": "issue 6, " + c["target"]} for c in out] + issue18_targets(results) + issue39_targets(results)


def zones_lines(wl: dict[str, Any]) -> list[str]:
    """Per protocol and zone: requests, tokens, CPU a request of each target, its ratio to the bare
    forwarder's in the same steps."""
    lines = [f"zones: {wl['description']}"]
    for protocol, p in wl["protocols"].items():
        zones = p["zones"]
        names = next(iter(zones.values()), {}).get("cpu_ms_per_req", {}).keys()
        others = [n for n in names if n != BASELINE]
        missing = f"; no {', '.join(p['missing'])} zone" if p.get("missing") else ""
        lines.append(f"{protocol} ({p['model']}, window {p['window']}, {p['steps']} steps{missing})")
        lines.append(f"  {'zone':<11} {'n':>4} {'tokens':>8} " + " ".join(f"{'CPU ms ' + n:>16}" for n in names)
                     + " " + " ".join(f"{n + '/base':>14}" for n in others)
                     + " " + " ".join(f"{'median ' + n + '/base':>21}" for n in others))
        for zone, row in zones.items():
            cells = [f"  {zone:<11} {row['n']:>4} {fmt(row['tokens'], 8)}"]
            cells += [fmt(row["cpu_ms_per_req"].get(n), 16) for n in names]
            cells += [fmt(row["cpu_vs_baseline"].get(n), 14) for n in others]
            cells += [fmt(row.get("median_vs_baseline", {}).get(n), 21) for n in others]
            lines.append(" ".join(cells))
        if past := p.get("past_prepare"):
            lines.append(f"  from the prepare line on, {past['steps']} steps, CPU summed: "
                         + ", ".join(f"{n} {past['cpu_ms'][n]:.0f} ms" for n in names if n in past["cpu_ms"])
                         + "; " + ", ".join(f"{n}/base " + _times(past["vs_baseline"].get(n)) for n in others))
    return lines


def _times(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def repeat_lines(wl: dict[str, Any]) -> list[str]:
    lines = [f"prepare_repeat: {wl['description']}"]
    for protocol, rows in wl["protocols"].items():
        tokens = rows.get("tokens")
        cells = [f"{name} {row['cpu_ms_per_req']:.2f} ms" + (f" ({row['cpu_vs_baseline']:.2f}x)" if row.get("cpu_vs_baseline") else "")
                 for name, row in rows.items() if isinstance(row, dict)]
        lines.append(f"  {protocol:<10} {fmt(tokens, 7)} tokens: CPU/req " + ", ".join(cells))
    return lines


def stall_lines(wl: dict[str, Any]) -> list[str]:
    lines = [f"big_body: {wl['description']}"]
    for name, r in wl["targets"].items():
        lines.append(f"  {name:<8} small n={r['n']} p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, max {r['max_ms']:.1f} ms;"
                     f" big {', '.join(f'{t:.1f}' for t in r['big_s'])} s, {r['cpu_s']:.1f} s of CPU (with its children)")
    return lines


def issue39_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 39's: every zone of the growing session and the repeated prepare-zone body within 2x
    the bare forwarder's CPU a request, in every protocol; small requests within 1.5x; streams'
    CPU within 1.3x."""
    out = []
    for protocol, p in results.get("zones", {}).get("protocols", {}).items():
        for zone, row in p["zones"].items():
            out.append(_check(f"{protocol}: zone {zone}: CPU/req vs bare forwarder", row["cpu_vs_baseline"].get(PROXY), 2.0, "x"))
        if "past_prepare" in p:  # the session's figure: where a preparation's CPU is charged does not move it
            out.append(_check(f"{protocol}: the session from the prepare line on: CPU summed vs bare forwarder",
                              p["past_prepare"]["vs_baseline"].get(PROXY), 2.0, "x"))
    for protocol, rows in results.get("prepare_repeat", {}).get("protocols", {}).items():
        out.append(_check(f"{protocol}: ~97k-token body repeated in the prepare zone: CPU/req vs bare forwarder",
                          rows.get(PROXY, {}).get("cpu_vs_baseline"), 2.0, "x"))
    for protocol, small, stream in (("chat", "small_1", "stream_8"), ("messages", "messages_small", "messages_stream"),
                                    ("responses", "responses_small", "responses_stream"),
                                    ("gemini", "gemini_small", "gemini_stream")):
        out.append(_check(f"{protocol}: small, 1 client: CPU/req vs bare forwarder", _row(results, small, PROXY).get("cpu_vs_baseline"), 1.5, "x"))
        out.append(_check(f"{protocol}: streaming: CPU/req vs bare forwarder", _row(results, stream, PROXY).get("cpu_vs_baseline"), 1.3, "x"))
    for name, row in results.get("big_body", {}).get("targets", {}).items():
        out.append(_check(f"{name}: small requests' p99 while 40 MB requests are processed", row.get("p99_ms"), 100, "ms"))
    return [{**c, "target": "issue 39, " + c["target"]} for c in out]


def _ttfb_ratio(results: dict[str, Any], workload: str) -> float | None:
    proxy, base = _row(results, workload, PROXY), _row(results, workload, BASELINE)
    if proxy.get("added_p50_ms") is None or not base.get("added_p50_ms"):
        return None
    return proxy["added_p50_ms"] / base["added_p50_ms"]


def issue18_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 18's targets: small requests and streams within 1.3x of the bare forwarder's CPU (and a
    stream's added time to first event within 1.3x of its), the 100k-token body within 2x, in every
    protocol; the reused ~1M-token request within +20 ms; what a second worker adds."""
    out = []
    for protocol, small, stream, large in (("chat", "small_1", "stream_8", "large_4"),
                                           ("messages", "messages_small", "messages_stream", "messages_large"),
                                           ("responses", "responses_small", "responses_stream", "responses_large"),
                                           ("gemini", "gemini_small", "gemini_stream", "gemini_large")):
        cpu = lambda w: _row(results, w, PROXY).get("cpu_vs_baseline")  # noqa: E731
        out += [
            _check(f"{protocol}: small, 1 client: CPU/req vs bare forwarder", cpu(small), 1.3, "x"),
            _check(f"{protocol}: streaming, 8 clients: CPU/req vs bare forwarder", cpu(stream), 1.3, "x"),
            _check(f"{protocol}: streaming: added first-event p50 vs bare forwarder's", _ttfb_ratio(results, stream), 1.3, "x"),
            _check(f"{protocol}: 100k-token body, 4 clients: CPU/req vs bare forwarder", cpu(large), 2.0, "x"),
        ]
    out.append(_check("chat: streaming, 8 clients out of step: added first-event p50 vs bare forwarder's (stated, no limit)",
                      _ttfb_ratio(results, "stream_8_spread"), None, "x"))
    out.append(_check("reused summary, ~1M tokens: proxy added p50", _row(results, "reused", PROXY).get("added_p50_ms"), 20, "ms"))
    scaling = results.get("throughput", {}).get("scaling")
    out.append(_check("2 workers vs 1: requests per second (stated, no limit)", scaling, None, "x"))
    return [{**c, "target": "issue 18, " + c["target"]} for c in out]


def targets_lines(checks: list[dict[str, Any]]) -> list[str]:
    lines = ["targets"]
    for c in checks:
        verdict = {True: "met", False: "NOT MET", None: "-"}[c["met"]]
        value = "not measured" if c["value"] is None else f"{c['value']:.2f} {c['unit']}".strip()
        limit = "" if c["limit"] is None else f" (limit {c['limit']:g} {c['unit']})".rstrip()
        lines.append(f"  [{verdict:^7}] {c['target']}: {value}{limit}")
    return lines


def render(doc: dict[str, Any]) -> str:
    meta = doc["meta"]
    wls = doc["workloads"]
    lines = [f"compaction-proxy benchmark ({'quick' if meta['quick'] else 'full'}), {meta['time']}, "
             f"{meta['cpus']} CPUs, Python {meta['python']}, commit {meta['commit']}, store {meta['store']}", ""]
    for name, wl in wls.items():
        lines.append(f"  {name}: {wl['description']}")
    lines += [""] + main_table(wls)
    if "long_conv" in wls:
        lines += [""] + long_table(wls["long_conv"])
    if warm := wls.get("reused", {}).get("warmup"):
        lines += ["", f"reused warm-up (first request, compacts): {warm['latency_ms']:.0f} ms, status {warm['status']}, "
                      f"tokens {warm['tokens_before']} -> {warm['tokens_after']}, {warm['summarizer_calls']} summarizer calls"]
    if cross := wls.get("crossing", {}).get("targets", {}).get(PROXY):
        lines += [""] + crossing_lines(wls["crossing"]["description"], cross)
    if "memory" in wls:
        lines += [""] + memory_table(wls["memory"])
    if "zones" in wls:
        lines += [""] + zones_lines(wls["zones"])
    if "prepare_repeat" in wls:
        lines += [""] + repeat_lines(wls["prepare_repeat"])
    if "big_body" in wls:
        lines += [""] + stall_lines(wls["big_body"])
    if (tp := wls.get("throughput")) and tp.get("scaling") is not None:
        rps = ", ".join(f"{name} {row['throughput_rps']:.0f} req/s" for name, row in tp["targets"].items())
        lines += ["", f"throughput: {rps}: 2 workers serve {tp['scaling']:.2f}x the requests of 1 ({tp['description']})"]
    if metrics := metrics_cost_lines(wls):
        lines += [""] + metrics
    lines += [""] + targets_lines(doc["targets_check"])
    for name, wl in wls.items():
        if "profile" in wl:
            lines += [""] + profile_lines(name, wl["profile"])
    return "\n".join(lines)


def metrics_cost_lines(wls: dict[str, Any]) -> list[str]:
    """The proxy with and without metrics, side by side (when the run had both)."""
    rows = [(name, wl["targets"]) for name, wl in wls.items()
            if PROXY in wl.get("targets", {}) and NO_METRICS in wl.get("targets", {})
            and "cpu_ms_per_req" in wl["targets"][PROXY]]
    if not rows:
        return []
    lines = ["cost of the operator's view: proxy CPU per request (ms) with everything on (proxy), metrics off "
             "(nometrics), metrics and access log off (noops)",
             f"{'workload':<10} {'proxy':>8} {'nometrics':>10} {'noops':>8} {'metrics us':>11} {'access log us':>14}"]
    for name, t in rows:
        on, off = t[PROXY]["cpu_ms_per_req"], t[NO_METRICS]["cpu_ms_per_req"]
        bare = t.get(NO_OPS, {}).get("cpu_ms_per_req")
        lines.append(f"{name:<10} {fmt(on, 8)} {fmt(off, 10)} {fmt(bare, 8)} {fmt((on - off) * 1000, 11)} "
                     f"{fmt(None if bare is None else (off - bare) * 1000, 14)}")
    return lines


def profile_lines(name: str, prof: dict[str, Any], n: int = 12) -> list[str]:
    lines = [f"proxy profile, {name}: {prof['samples']} samples ({prof['file']})",
             f"  {'self %':>6}  {'function':<58} {'inclusive %':>11}  function"]
    for (fs, ps), (fi, pi) in zip(prof["self_pct"][:n], prof["inclusive_pct"][:n]):
        lines.append(f"  {ps:>6.1f}  {fs[:58]:<58} {pi:>11.1f}  {fi}")
    return lines
