"""Replay the tau-bench conversations turn by turn through the proxy with a small window (issue 3 figures).

    /work/venv/bin/python bench/replay_report.py [--window 6000] [--conversations 200]

Each conversation of tests/fixtures/tau-bench/gpt-4o-airline.json is sent the way an agent
sends it: before every assistant message, the whole history so far, with the openai client,
through the real proxy to the fake upstream on loopback. The fake's context window equals the
proxy's (it rejects anything larger, as OpenAI does) and its summarizer writes valid summaries.
Prints compaction events, summarizer calls, how often the forwarded request extended the previous
one (the upstream prompt cache's condition), and the largest forwarded request against the window.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the fake upstream lives there


from proxy.compaction.budget import Budget  # noqa: E402
from proxy.fakes.chat import FakeUpstream  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402
from support.client import openai_client  # noqa: E402
from support.proxy_server import start_proxy  # noqa: E402

FIXTURE = REPO / "tests" / "fixtures" / "tau-bench" / "gpt-4o-airline.json"
MODEL = "gpt-4"  # cl100k_base on both sides, so the proxy and the fake count alike
TURN_PROMPT = (REPO / "prompts" / "compaction-turn-prefix.md").read_text(encoding="utf-8").strip()


def request_points(traj: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """What a client sends: the history before each assistant message."""
    return [traj[:i] for i in range(1, len(traj)) if traj[i]["role"] == "assistant"]


async def replay_one(client: AsyncOpenAI, upstream: FakeUpstream, traj: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """(status, forwarded messages) per request of one conversation."""
    out = []
    for history in request_points(traj):
        raw = await client.chat.completions.with_raw_response.create(model=MODEL, messages=history)
        raw.parse()
        out.append((raw.headers["x-compaction-status"], upstream.chat_requests[-1]["messages"]))
    return out


async def main(window: int, limit: int) -> int:
    conversations = json.loads(FIXTURE.read_text())[:limit]
    budget = Budget.for_model(window, threshold_tokens=None, threshold_percent=None, reserve_tokens=None,
                              keep_recent_tokens=20_000)
    statuses: Counter[str] = Counter()
    pairs = extended = pairs_between = extended_between = compacted_conversations = 0
    started = time.perf_counter()
    async with FakeUpstream(window=window) as upstream:
        proxy = await start_proxy(upstream.base_url, {"models": {MODEL: {"context_window": window}},
                                                      "compaction": {"prepare_percent": 0}})
        try:
            async with openai_client(proxy, "sk-replay") as client:
                for conv in conversations:
                    results = await replay_one(client, upstream, conv["traj"])
                    statuses.update(s for s, _ in results)
                    compacted_conversations += any(s == "summarized" for s, _ in results)
                    for (_, prev), (status, cur) in zip(results, results[1:]):
                        grew = cur[: len(prev)] == prev
                        pairs += 1
                        extended += grew
                        if status != "summarized":  # between two compactions
                            pairs_between += 1
                            extended_between += grew
        finally:
            await proxy.close()
    elapsed = time.perf_counter() - started

    chats = upstream.records("chat")
    summarizer = upstream.records("summarizer")
    turn_calls = sum(TURN_PROMPT in r.json["messages"][1]["content"] for r in summarizer)
    largest = max(r.prompt_tokens or 0 for r in chats)
    rejected = sum(r.status != 200 for r in chats)
    prompt = sum(r.prompt_tokens or 0 for r in chats)
    cached = sum(r.cached_tokens or 0 for r in chats)
    print(f"tau-bench airline: {len(conversations)} conversations, {len(chats)} requests, replayed in {elapsed:.1f} s")
    print(f"window {window} tokens; threshold {budget.threshold} (W - 15%), hysteresis target {budget.target} "
          f"(0.8 x threshold), keep_recent {budget.keep_recent}, summary output cap {budget.output_cap}")
    print(f"statuses: {dict(sorted(statuses.items()))}")
    print(f"compaction events: {statuses['summarized']} in {compacted_conversations} conversations")
    print(f"summarizer calls: {len(summarizer)} ({len(summarizer) - turn_calls} main summaries, "
          f"{turn_calls} split-turn prefixes); failed summaries: {statuses['failed-open']}")
    print(f"forwarded prefix extended the previous request: {extended}/{pairs} consecutive requests "
          f"({100 * extended / pairs:.1f}%); between compactions: {extended_between}/{pairs_between} "
          f"({100 * extended_between / pairs_between:.1f}%)")
    print(f"largest forwarded request: {largest} tokens = {100 * largest / window:.1f}% of the window; "
          f"upstream rejections: {rejected}")
    print(f"simulated prompt-cache hits: {cached}/{prompt} prompt tokens ({100 * cached / prompt:.1f}%)")
    return 0 if rejected == 0 and extended_between == pairs_between else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--window", type=int, default=6000, help="context window of the proxy and the fake (tokens)")
    ap.add_argument("--conversations", type=int, default=200, help="replay the first N conversations")
    args = ap.parse_args()
    sys.exit(asyncio.run(main(args.window, args.conversations)))
