"""Replay a real SWE-agent run with its tool outputs enlarged past the threshold (issue 4 figures).

    /work/venv/bin/python bench/tool_results_replay.py [--base-tokens 4500] [--step-tokens 250]

Every tool output of tests/fixtures/swe-agent/marshmallow-1867 is padded with a realistic
`pytest -v` log (tests/support/transcripts.py) that plants six known identifiers per output in its
middle. The run is sent request by request (the history before each assistant turn, then the whole
run) with the openai client through the real proxy to the fake upstream on loopback, whose
summarizer writes a short note that names none of the planted identifiers: whatever survives was
kept by the proxy's code. Prints tokens before and after, summarizer calls, and identifier survival.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the fake upstream and transcript helpers live there

from proxy.compaction.extract import find_identifiers  # noqa: E402
from proxy.fakes.chat import FakeUpstream  # noqa: E402
from proxy.fakes.common import count_text_tokens  # noqa: E402
from support.client import openai_client  # noqa: E402
from support.proxy_server import start_proxy  # noqa: E402
from support.transcripts import enlarge_tool_outputs, replay, swe_agent_messages  # noqa: E402

TRAJ = REPO / "tests" / "fixtures" / "swe-agent" / "marshmallow-1867.function_calling.traj"
MODEL = "gpt-4o"


async def main(base_tokens: int, step_tokens: int) -> int:
    original = swe_agent_messages(TRAJ)
    enlarged = enlarge_tool_outputs(original, lambda k: base_tokens + step_tokens * k, count_text_tokens)
    async with FakeUpstream() as upstream:
        proxy = await start_proxy(upstream.base_url, {"models": {MODEL: {"context_window": 128_000}},
                                                      "compaction": {"prepare_percent": 0}})
        try:
            async with openai_client(proxy, "sk-bench") as client:
                started = time.perf_counter()
                rep = await replay(client, upstream, enlarged, MODEL, find_identifiers)
                elapsed = time.perf_counter() - started
        finally:
            await proxy.close()

    raw_real = [count_text_tokens(original[i]["content"]) for i in sorted(enlarged.planted)]
    print(f"transcript: {TRAJ.name}: {len(original)} messages, {len(enlarged.planted)} tool outputs")
    print(f"tool outputs, real: {sum(raw_real)} tokens (max {max(raw_real)}); enlarged: "
          f"{sum(rep.raw_tool_tokens)} tokens ({min(rep.raw_tool_tokens)}-{max(rep.raw_tool_tokens)} each)")
    print(f"requests replayed: {rep.requests} in {elapsed:.2f} s; history status: {sorted(set(rep.statuses))}")
    print("per request (tokens before -> after, notes):")
    for n, (b, a, k) in enumerate(zip(rep.tokens_before, rep.tokens_after, rep.notes_per_request), 1):
        print(f"  {n:2d}: {b:7d} -> {a:6d}  ({k} notes)")
    b, a = rep.tokens_before[-1], rep.tokens_after[-1]
    print(f"last request: {b} -> {a} tokens ({100 * (1 - a / b):.1f}% smaller)")
    tb, ta = sum(rep.tokens_before), sum(rep.tokens_after)
    print(f"all requests: {tb} -> {ta} tokens sent upstream ({100 * (1 - ta / tb):.1f}% smaller)")
    print(f"notes: {sum(rep.note_tokens)} tokens ({min(rep.note_tokens)}-{max(rep.note_tokens)} each)")
    print(f"tool-result summarizer calls: {rep.summarizer_calls} for {len(enlarged.planted)} outputs")
    print(f"notes byte-identical across requests: {rep.stable_notes}; notes naming the right tool: "
          f"{len(enlarged.planted) - len(rep.misnamed)}/{len(enlarged.planted)}")
    print(f"planted identifiers kept: {rep.planted_kept}/{rep.planted_total}"
          + (f"; lost: {rep.lost}" if rep.lost else ""))
    print(f"identifiers the extractor finds in the raw outputs, kept: {rep.extracted_kept}/{rep.extracted_total}")
    ok = not rep.lost and not rep.misnamed and rep.stable_notes and rep.summarizer_calls == len(enlarged.planted)
    return 0 if ok else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-tokens", type=int, default=4500, help="size of the first enlarged output")
    ap.add_argument("--step-tokens", type=int, default=250, help="each later output this much larger")
    args = ap.parse_args()
    sys.exit(asyncio.run(main(args.base_tokens, args.step_tokens)))
