"""Long replays with a careless summarizer (issue 12's before/after figures).

    .venv/bin/python bench/careless_replay.py [--label after] [--json out.json] [--only tau,swe,coding]

Three sessions, each sent the way an agent sends it (the whole history before every assistant
message, with the openai client) through the real proxy to the fake upstream on loopback, whose
context window equals the proxy's (it rejects anything larger with `context_length_exceeded`, as
OpenAI does) and whose history summarizer is `tests/support/careless.CarelessSummarizer` (skips
headings, paraphrases, keeps one identifier in ten, drops error lines, answers instead of
summarizing every 4th call):

- tau:    the 5 longest tau-bench airline conversations, window 6000 (gpt-4, cl100k on both sides);
- swe:    the SWE-agent marshmallow run, every tool output padded to ~1500 tokens with planted
          identifiers (tests/support/transcripts.py), window 12000;
- coding: the synthetic coding session of tests/support/coding_session.py (30 turns), window 12000.

The same requests also go straight to a fake upstream with no proxy in between (same window:
an upstream without a window limit, so its bill covers every request; those over the window are
counted as the failures they would be).

Per session it prints: requests over the window (forwarded and rejected by the upstream), failed
requests (what the client saw), compaction events and history-summarizer calls per event,
identifier retention by kind (share of (request, identifier) pairs in which an identifier the
client had sent so far is verbatim in the forwarded request; "+recall": or listed in a stored
record's recall field), the share of compacted requests served by masking alone, and the bill:
input tokens the upstream reported, uncached + cached x price ratio, at OpenAI's cached-input
ratios 0.1 (gpt-5 family) and 0.25 (gpt-4.1 family), summarizer calls included, against no proxy.
Compaction is made on the request path (`prepare_percent: 0`) so each figure belongs to the
request that caused it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the careless summarizer and the session generators live there

import openai  # noqa: E402

from support.careless import CarelessSummarizer  # noqa: E402
from support.client import openai_client  # noqa: E402
from support.coding_session import coding_session  # noqa: E402
from proxy.fakes.chat import FakeUpstream  # noqa: E402
from proxy.fakes.common import count_text_tokens  # noqa: E402
from support.proxy_server import merge, start_proxy  # noqa: E402
from support.transcripts import enlarge_tool_outputs, swe_agent_messages  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures"
MODEL = "gpt-4"
CACHED_RATIOS = (0.1, 0.25)

# Identifier kinds found in the fixtures by this script's own patterns (independent of the
# proxy's extractor, so the figure is not the proxy grading itself).
_KIND_PATTERNS = {
    "error": re.compile(r"(?m)^\s*(?:E\s+)?((?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception): .{3,200}?)\s*$"),
    "url": re.compile(r"https?://[^\s\"'<>)\]]+"),
    "ticket": re.compile(r"\b[A-Z][A-Z0-9]{1,9}-\d{2,}[A-Z]?\b"),
    "commit": re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"),
    "path": re.compile(r"(?<![\w/:])(?:/[\w.-]+)+/[\w.-]+\.\w+|\b[\w-]+(?:/[\w.-]+)+\.\w{1,5}\b"),
    "id": re.compile(r"\b(?=[A-Za-z0-9_]*\d)(?=[A-Za-z0-9_]*[A-Za-z])[A-Za-z0-9_]{6,}\b"),
}


def message_text(m: dict[str, Any]) -> str:
    c = m.get("content")
    if isinstance(c, list):
        c = "\n".join(p.get("text", "") for p in c if isinstance(p, dict))
    parts = [c or ""]
    for call in m.get("tool_calls") or ():
        parts.append(str((call.get("function") or {}).get("arguments", "")))
    return "\n".join(parts)


def find_kinds(messages: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """kind -> {identifier: index of the first message carrying it}, over non-system messages."""
    out: dict[str, dict[str, int]] = defaultdict(dict)
    for i, m in enumerate(messages):
        if m.get("role") == "system":
            continue
        text = message_text(m)
        claimed: set[str] = set()
        for kind, pat in _KIND_PATTERNS.items():
            for mt in pat.finditer(text):
                tok = (mt.group(1) if mt.groups() else mt.group(0)).rstrip(".,;:")
                if any(tok in c for c in claimed):  # the digits of a URL are not an ID of their own
                    continue
                claimed.add(tok)
                out[kind].setdefault(tok, i)
    return out


def request_points(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    pts = [messages[:i] for i in range(1, len(messages)) if messages[i]["role"] == "assistant"]
    if messages[-1]["role"] == "user":
        pts.append(messages)
    return pts


def sessions(only: set[str]) -> list[tuple[str, int, list[list[dict[str, Any]]], list[dict[str, Any]] | None]]:
    """(name, window, conversations, tools)."""
    out = []
    if "tau" in only:
        data = json.loads((FIXTURES / "tau-bench" / "gpt-4o-airline.json").read_text())
        data.sort(key=lambda d: -len(json.dumps(d["traj"])))
        out.append(("tau", 6000, [[dict(m) for m in d["traj"]] for d in data[:5]], None))
    if "swe" in only:
        swe = swe_agent_messages(FIXTURES / "swe-agent" / "marshmallow-1867.function_calling.traj")
        enlarged = enlarge_tool_outputs(swe, lambda k: 1500, count_text_tokens)
        out.append(("swe", 12000, [enlarged.messages], None))
    if "coding" in only:
        s = coding_session(30)
        out.append(("coding", 12000, [s.messages], s.tools))
    return out


def bill(records: list[Any], ratio: float) -> float:
    total = 0.0
    for r in records:
        if r.status == 200 and r.prompt_tokens is not None:
            cached = r.cached_tokens or 0
            total += (r.prompt_tokens - cached) + ratio * cached
    return total


def recall_field(proxy: Any) -> set[str]:
    """Identifiers the proxy's records list for recall (`SummaryRecord.recall_identifiers`, the
    field this issue adds; absent before it), from the engine's cache of the records it made."""
    found: set[str] = set()
    for rec in list(proxy.state.compaction._records.values()):
        found.update(getattr(rec, "recall_identifiers", None) or [])
    return found


async def run_session(name: str, window: int, convs: list[list[dict[str, Any]]], tools: list | None,
                      overrides: dict[str, Any]) -> dict[str, Any]:
    statuses: Counter[str] = Counter()
    failed = 0
    kept: Counter[str] = Counter()
    kept_or_recall: Counter[str] = Counter()
    seen: Counter[str] = Counter()
    # the product's defaults (the test harness turns ratio learning and the cache-riding call off)
    settings = {"models": {MODEL: {"context_window": window}},
                "compaction": {"prepare_percent": 0, "learn_token_ratio": True, "cached_summary_call": True}}
    careless = CarelessSummarizer()
    extra = {"tools": tools} if tools else {}
    started = time.perf_counter()
    # No proxy: an upstream without a window limit, so the bill covers every request; those over
    # the real window are counted as the failures they would be.
    async with FakeUpstream(window=window, summarizer=careless) as upstream, FakeUpstream(window=10**9) as direct:
        proxy = await start_proxy(upstream.base_url, merge(settings, overrides))
        try:
            async with openai_client(proxy, "sk-bench") as client, \
                    openai_client(direct, "sk-bench") as plain:
                direct_failed = 0
                for conv in convs:
                    kinds = find_kinds(conv)
                    for history in request_points(conv):
                        n_before = len(upstream.chat_requests)
                        try:
                            raw = await client.chat.completions.with_raw_response.create(
                                model=MODEL, messages=history, **extra)
                            raw.parse()
                            statuses[raw.headers["x-compaction-status"]] += 1
                        except openai.APIError:
                            failed += 1
                        await plain.chat.completions.create(model=MODEL, messages=history, **extra)
                        direct_failed += (direct.requests[-1].prompt_tokens or 0) > window
                        if len(upstream.chat_requests) == n_before or upstream.records("chat")[-1].status != 200:
                            continue  # retention counts the requests the upstream served
                        fwd_text = "\n".join(message_text(m) for m in upstream.chat_requests[-1]["messages"])
                        recall = recall_field(proxy)
                        for kind, ids in kinds.items():
                            for ident, first in ids.items():
                                if first < len(history):
                                    seen[kind] += 1
                                    hit = ident in fwd_text
                                    kept[kind] += hit
                                    kept_or_recall[kind] += hit or ident in recall
        finally:
            stats = dict(getattr(proxy.state.compaction, "stats", {}) or {})
            await proxy.close()
    chats = upstream.records("chat")
    history_calls = len(upstream.history_summarizer_requests)
    events = statuses["summarized"] + stats.get("events_masked", 0) + stats.get("events_degraded", 0)
    compacted = sum(n for s, n in statuses.items() if s not in ("none", "bypassed", "failed-open"))
    all_records = upstream.records("chat") + upstream.records("summarizer")
    return {
        "session": name,
        "window": window,
        "requests": sum(statuses.values()) + failed,
        "seconds": round(time.perf_counter() - started, 1),
        "statuses": dict(sorted(statuses.items())),
        "over_window": sum(1 for r in chats if (r.prompt_tokens or 0) > window),
        "failed": failed,
        "no_proxy_failed": direct_failed,
        "compaction_events": events,
        "history_summarizer_calls": history_calls,
        "careless_replies": careless.replies,
        "calls_per_event": round(history_calls / events, 2) if events else None,
        "masked_share": round(statuses["masked"] / compacted, 3) if compacted else 0.0,
        "retention": {k: round(kept[k] / seen[k], 4) for k in sorted(seen)},
        "retention_or_recall": {k: round(kept_or_recall[k] / seen[k], 4) for k in sorted(seen)},
        "engine_stats": stats,
        "bill": {str(r): round(bill(all_records, r)) for r in CACHED_RATIOS},
        "bill_summarizer_uncached": sum((r.prompt_tokens or 0) - (r.cached_tokens or 0)
                                        for r in upstream.records("summarizer") if r.status == 200),
        "no_proxy_bill": {str(r): round(bill(direct.records("chat"), r)) for r in CACHED_RATIOS},
    }


def print_report(label: str, results: list[dict[str, Any]]) -> None:
    print(f"== careless summarizer replays ({label})")
    for r in results:
        print(f"\n[{r['session']}] window {r['window']}, {r['requests']} requests in {r['seconds']} s")
        print(f"  statuses: {r['statuses']}")
        print(f"  requests over the window: {r['over_window']}; failed requests: {r['failed']} "
              f"(no proxy: {r['no_proxy_failed']})")
        print(f"  compaction events: {r['compaction_events']}; history summarizer calls: "
              f"{r['history_summarizer_calls']} ({r['careless_replies']} answered with a reply); "
              f"per event: {r['calls_per_event']}")
        print(f"  compacted by masking alone: {100 * r['masked_share']:.1f}%")
        print("  identifier retention (verbatim): " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in r["retention"].items()))
        print("  identifier retention (+recall):  " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in r["retention_or_recall"].items()))
        for ratio in CACHED_RATIOS:
            b, nb = r["bill"][str(ratio)], r["no_proxy_bill"][str(ratio)]
            print(f"  bill at cached x{ratio}: {b} token-units vs {nb} without the proxy ({100 * b / nb:.0f}%)")
        print(f"  summarizer calls' uncached input tokens: {r['bill_summarizer_uncached']}")


async def main(args: argparse.Namespace) -> int:
    only = set(args.only.split(","))
    overrides = {"compaction": {"required_headings": []}} if args.headings_off else {}
    results = [await run_session(*s, overrides) for s in sessions(only)]
    print_report(args.label, results)
    if args.json:
        Path(args.json).write_text(json.dumps({"label": args.label, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", default="current code")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    ap.add_argument("--only", default="tau,swe,coding")
    ap.add_argument("--headings-off", action="store_true",
                    help="compaction.required_headings: [] (the default after issue 12; before it, the workaround)")
    sys.exit(asyncio.run(main(ap.parse_args())))
