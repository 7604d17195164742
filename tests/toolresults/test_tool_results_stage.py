"""The tool-result stage on a flow built in the test (support.flows), with no proxy and no client
HTTP: the stage is made as the proxy makes it, with its clock given at construction, and its
summarizer calls go to the fake upstream on loopback through the real SummaryCaller."""

from __future__ import annotations

import aiohttp
import pytest

from proxy.config import Config
from proxy.prompts import Prompts
from proxy.store.memory import MemoryStore
from proxy.toolresults.stage import ToolResultStage
from proxy.upstream import SummaryCaller
from support.clock import FakeClock
from support.compaction_helpers import counter, tool_call
from support.flows import make_flow

MODEL = "gpt-4"
NOTE = "[Summary of fetch_logs output]"


def logs(tag: str, lines: int = 80) -> str:
    return "\n".join(f"[{tag}] worker-{i % 4} INFO job {i} finished in {i * 7} ms" for i in range(lines))


def conversation(tag: str, call_ids: list[str]) -> list[dict]:
    return [{"role": "user", "content": "check the workers"},
            {"role": "assistant", "content": None, "tool_calls": [tool_call(i, "fetch_logs", '{"q": "x"}') for i in call_ids]},
            *({"role": "tool", "tool_call_id": i, "content": logs(tag + i)} for i in call_ids)]


@pytest.fixture
async def stage_for(upstream):
    """`stage_for(clock)`: a ToolResultStage as ProxyState builds it, summarizing through the fake."""
    async with aiohttp.ClientSession() as session:

        def make(clock: FakeClock) -> ToolResultStage:
            cfg = Config.model_validate({"upstream": {"base_url": upstream.base_url}, "store": {"url": "memory://"},
                                         "tool_results": {"threshold_tokens": 300}})
            return ToolResultStage(cfg, MemoryStore(ttl_s=3600, max_records=1000),
                                   SummaryCaller(session, cfg), Prompts(), counter(), clock=clock)

        yield make


async def test_an_oversized_result_becomes_a_note_and_a_small_one_stays(upstream, stage_for):
    stage = stage_for(FakeClock())
    small = make_flow([{"role": "user", "content": "hi"}, *conversation("s", ["c0"])[1:2],
                       {"role": "tool", "tool_call_id": "c0", "content": "ok"}], model=MODEL)
    await stage.request(small)
    assert not small.changed and small.body() == small.request.raw and upstream.summarizer_requests == []

    flow = make_flow(conversation("big", ["c1"]), model=MODEL)
    await stage.request(flow)
    assert flow.changed and flow.report.tool_results == 1
    assert flow.forwarded.envelopes[2].text.startswith(NOTE)
    assert flow.forwarded.envelopes[:2] == flow.original.envelopes[:2]  # the rest is the client's, unchanged
    assert len(upstream.tool_summarizer_requests) == 1


async def test_the_breaker_opens_after_three_failures_and_one_trial_after_the_cooldown_closes_it(upstream, stage_for):
    clock = FakeClock(1_700_000_000.0)
    stage = stage_for(clock)
    upstream.fault_target, upstream.fail_status = "summarizer", 500

    async def run(tag: str, ids: list[str]):
        flow = make_flow(conversation(tag, ids), model=MODEL)
        await stage.request(flow)
        return flow

    for n in range(1, 4):
        flow = await run("fail", [f"c{n}"])
        assert len(upstream.tool_summarizer_requests) == n and flow.report.tool_results == 0
        assert "HTTP 500" in flow.forwarded.envelopes[2].text.split("\n")[0]
    # Open: the notice, without a call, until the cool-down (300 s) has passed on the stage's clock.
    assert "paused" in (await run("open", ["c4"])).forwarded.envelopes[2].text.split("\n")[0]
    clock.advance(299)
    await run("open", ["c5"])
    assert len(upstream.tool_summarizer_requests) == 3
    clock.advance(2)
    upstream.fail_status = None
    assert (await run("half", ["c6"])).report.tool_results == 1  # the one trial, a success
    assert (await run("closed", ["c7", "c8"])).report.tool_results == 2  # closed: calls go out again
    assert len(upstream.tool_summarizer_requests) == 6
