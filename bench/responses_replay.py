"""Replay the recorded Codex session through the proxy as Codex sends it (issue 14 figures).

    .venv/bin/python bench/responses_replay.py [--window 3000] [--http 2]

tests/fixtures/sessions/codex-responses.json's 13 model calls: the first `--http` as zstd HTTP
bodies streamed back as SSE, the rest as `response.create` on one WebSocket, through the real
proxy to the strict fake Responses upstream (its window equals the proxy's; it rejects anything
larger, checks every call's pairing and every reasoning item's place). Prints the compaction
events (distinct summaries carried), the summarizer calls by kind, prefix stability (how often a
forwarded request carried the previous one's summary prefix byte for byte), and the largest
forwarded request against the window, with the session's own largest request for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from proxy.fakes.responses import FakeResponses  # noqa: E402
from support.codex_replay import replay_codex, summary_items  # noqa: E402
from support.proxy_server import start_proxy  # noqa: E402
from support.sessions import FIXTURE_SIGNING_KEY, codex_requests  # noqa: E402


def prefix_of(body: dict) -> bytes | None:
    """instructions + input up to the summary item, as JSON (None before any summary)."""
    items = body.get("input") or []
    for k, it in enumerate(items):
        if "<summary>" in json.dumps(it):
            return json.dumps([body.get("instructions"), items[:k + 1]], sort_keys=True).encode()
    return None


async def run(window: int, http: int) -> None:
    async with FakeResponses(window=window, signing_key=FIXTURE_SIGNING_KEY) as fake:
        fake.reply = "Done with that step."
        proxy = await start_proxy(fake.base_url, {"models": {"default": {"context_window": window}},
                                                  "compaction": {"prepare_percent": 0, "keep_recent_tokens": 800}})
        try:
            result = await replay_codex(proxy.base_url, http_requests=http)
        finally:
            await proxy.close()
        forwarded = fake.records("responses")
        bodies = [r.json for r in forwarded]
        summaries = [s for s in summary_items(bodies) if s]
        prefixes = [prefix_of(b) for b in bodies]
        pairs = [(a, b) for a, b in zip(prefixes, prefixes[1:]) if a is not None and b is not None]
        stable = sum(a == b for a, b in pairs)
        own = [fake.count_input_tokens(b, b["input"]) for b in codex_requests()]
        print(f"model calls: {len(result.turns)} ({http} over HTTP with zstd bodies, the rest over one WebSocket); "
              f"ends: {dict(Counter(t.end for t in result.turns))}; upstream statuses: "
              f"{dict(Counter(r.status for r in forwarded))}")
        print(f"compaction events: {len(set(summaries))} (history summary first carried by call "
              f"{next((i + 1 for i, p in enumerate(prefixes) if p), None)})")
        print(f"summarizer calls: {dict(Counter(r.summarizer_kind for r in fake.records('summarizer')))}")
        print(f"prefix stability: {stable}/{len(pairs)} consecutive requests after the compaction carried the same "
              "instructions + summary prefix byte for byte")
        print(f"largest forwarded request: {max(r.prompt_tokens for r in forwarded)} tokens (the fake's count) against "
              f"a {window}-token window; the session's own largest: {max(own)} tokens")
        print(f"statuses seen by the client (HTTP headers, then response.created on the socket): "
              f"{[t.compaction for t in result.turns]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--window", type=int, default=3000)
    p.add_argument("--http", type=int, default=2, help="model calls sent over HTTP before the WebSocket")
    args = p.parse_args()
    asyncio.run(run(args.window, args.http))


if __name__ == "__main__":
    main()
