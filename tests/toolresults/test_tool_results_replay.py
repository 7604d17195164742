"""A real SWE-agent run replayed through the proxy with every tool output enlarged past the default
threshold (issue 4's closing figures; bench/tool_results_replay.py prints them in full)."""

from __future__ import annotations

from proxy.compaction.extract import find_identifiers
from proxy.fakes.common import count_text_tokens
from support.client import openai_client
from support.transcripts import enlarge_tool_outputs, replay, swe_agent_messages

MODEL = "gpt-4o"
TRAJ = "swe-agent/marshmallow-1867.function_calling.traj"


async def test_enlarged_swe_agent_run_keeps_every_identifier(upstream, make_proxy, fixtures_dir):
    proxy = await make_proxy(upstream.base_url, {"models": {MODEL: {"context_window": 128_000}},
                                                 "compaction": {"prepare_percent": 0}})
    enlarged = enlarge_tool_outputs(swe_agent_messages(fixtures_dir / TRAJ), lambda k: 4500 + 250 * k,
                                    count_text_tokens)
    async with openai_client(proxy, "sk-replay") as client:
        rep = await replay(client, upstream, enlarged, MODEL, find_identifiers)

    assert len(enlarged.planted) == 11 and min(rep.raw_tool_tokens) > 4000  # the default threshold
    assert rep.lost == [] and rep.planted_kept == rep.planted_total == 66
    assert rep.extracted_kept == rep.extracted_total
    assert rep.summarizer_calls == len(enlarged.planted)  # one per output, reused afterwards
    assert rep.stable_notes
    assert rep.misnamed == []  # the run reuses call ids across turns
    assert rep.notes_per_request[-1] == len(enlarged.planted)
    assert set(rep.statuses) == {"none"}
    assert rep.tokens_after[-1] < rep.tokens_before[-1] // 4
