"""A request no stage can change skips the stages (flow.run_request), and only such a request.

Each stage says whether its `request` hook would leave a flow as it is (`Stage.idle`, pure); the
route's run_request runs none of them when all are idle. These tests hold the decision to the
hooks themselves: an idle flow run through the real stages comes out unchanged with nothing
stored or asked, and each way a small body can still need a stage (images counted as many tokens
for few bytes, a learned ratio above 1, a tool result over its threshold, a history far enough
along to prepare its summary, the threshold itself) makes it not idle.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.protocols.messages.adapter import MessagesAdapter
from proxy.protocols.responses.adapter import ResponsesAdapter
from proxy.compaction.engine import CompactionEngine
from proxy.compaction.stage import CompactionStage
from proxy.compaction.summarizer import HistorySummarizer
from proxy.config import Config
from proxy.flow import Flow, Report, Stage, run_request
from proxy.ops.hooks import Hooks
from proxy.prompts import Prompts
from proxy.store.memory import MemoryStore
from proxy.toolresults.stage import ToolResultStage
from support.compaction_helpers import counter, filler, main_summary
from support.flows import make_flow

WINDOW = 8000  # threshold 6800 with the default 85%


class Summaries:
    """The summarizer and note caller: every call is recorded (an idle flow must make none)."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    async def complete(self, *args: Any, **kw: Any) -> str:
        self.calls.append(args)
        return main_summary("x")


def stages_for(cfg: Config) -> tuple[list[Stage], MemoryStore, Summaries, CompactionEngine]:
    store, calls, prompts = MemoryStore(ttl_s=3600, max_records=1000), Summaries(), Prompts()
    engine = CompactionEngine(cfg, store, HistorySummarizer(calls, prompts, lambda t: counter().count_text(t, "cl100k_base")),
                              counter(), prompts)
    return [ToolResultStage(cfg, store, calls, prompts, counter()), CompactionStage(engine, Hooks())], store, calls, engine


def config(**sections: Any) -> Config:
    models = {"gpt-4": {"context_window": WINDOW, **sections.pop("model", {})}}
    compaction = {"prepare_percent": 0, "cached_summary_call": False, **sections.pop("compaction", {})}
    return Config.model_validate({"models": models, "compaction": compaction, **sections})


def chat(*messages: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You are terse."}, *messages]


def image(n: int) -> dict[str, Any]:
    """A user message of `n` tiny images: a few hundred bytes, ~765 tokens each."""
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}}] * n}


def tool_turn(output: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "look"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "grep", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": output}, {"role": "user", "content": "and?"}]


async def assert_left_alone(flow: Flow, stages: list[Stage], store: MemoryStore, calls: Summaries) -> None:
    """The hooks themselves, run on an idle flow: nothing forwarded differently, reported, stored or asked."""
    before = flow.report.tokens_before
    for stage in stages:
        await stage.request(flow)
    assert not flow.changed and flow.body() == flow.request.raw
    report = flow.report
    assert (report.status, report.tool_results, report.wait_ms, report.reason, report.record) == ("none", 0, 0.0, "", None)
    assert report.tokens_after in (None, before) and flow.total() == before
    assert not calls.calls and not store._lru and not store._permanent and not store._logs  # nothing asked or stored


async def test_run_request_runs_no_hook_when_every_stage_is_idle_and_every_hook_otherwise() -> None:
    ran: list[str] = []

    class Named(Stage):
        def __init__(self, name: str, idle: bool) -> None:
            self.name, self._idle = name, idle

        def idle(self, flow: Flow) -> bool:
            return self._idle

        async def request(self, flow: Flow) -> None:
            ran.append(self.name)

    flow = make_flow([{"role": "user", "content": "hi"}])
    await run_request([Named("a", True), Named("b", True)], flow)
    assert ran == []
    await run_request([Named("a", True), Named("b", False)], flow)
    assert ran == ["a", "b"]  # one that may act: all run, in order, as before
    ran.clear()

    class Default(Stage):
        async def request(self, flow: Flow) -> None:
            ran.append("default")

    await run_request([Named("a", True), Default()], flow)
    assert ran == ["a", "default"]  # a stage that says nothing is never skipped


@pytest.mark.parametrize("messages", [
    chat({"role": "user", "content": "What is the capital of France?"}),
    chat(*tool_turn("three matches in src/app.py")),
    [{"role": "user", "content": filler(800)}],  # no system message, still small
])
async def test_a_small_chat_request_is_idle_and_the_stages_would_leave_it_alone(messages: list[dict[str, Any]]) -> None:
    cfg = config()
    stages, store, calls, _ = stages_for(cfg)
    flow = make_flow(messages, cfg=cfg)
    assert all(s.idle(flow) for s in stages)
    await assert_left_alone(flow, stages, store, calls)


async def test_the_compaction_threshold_itself_is_idle_and_one_token_more_is_not() -> None:
    cfg = config(tool_results={"enabled": False})
    stages, store, calls, engine = stages_for(cfg)
    compaction = stages[1]
    base = make_flow(chat({"role": "user", "content": "x"}), cfg=cfg)
    threshold = engine.budget(base).threshold
    # grow the text until the count reaches the threshold exactly (one-token words)
    words = threshold - base.report.tokens_before
    flow = make_flow(chat({"role": "user", "content": "x" + " x" * words}), cfg=cfg)
    while flow.report.tokens_before > threshold:
        words -= 1
        flow = make_flow(chat({"role": "user", "content": "x" + " x" * words}), cfg=cfg)
    assert flow.report.tokens_before == threshold
    assert compaction.idle(flow)
    await assert_left_alone(flow, stages, store, calls)
    over = make_flow(chat({"role": "user", "content": "x" + " x" * (words + 1)}), cfg=cfg)
    assert over.report.tokens_before == threshold + 1 and not compaction.idle(over)


async def test_images_count_as_many_tokens_for_few_bytes_so_a_short_body_of_them_is_not_idle() -> None:
    cfg = config(tool_results={"enabled": False})
    stages, *_ = stages_for(cfg)
    flow = make_flow(chat(image(10), {"role": "user", "content": "what is in these?"}), cfg=cfg)
    assert len(flow.request.raw) < 1500 < 6800 < flow.report.tokens_before  # bytes far under, tokens over
    assert not stages[1].idle(flow)


async def test_a_token_ratio_above_one_can_put_a_short_body_over_its_threshold() -> None:
    messages = chat({"role": "user", "content": filler(2500)})
    plain, scaled = config(), config(model={"token_ratio": 3.0})
    assert stages_for(plain)[0][1].idle(make_flow(messages, cfg=plain))
    flow = make_flow(messages, cfg=scaled)
    assert flow.report.tokens_before > 6800 and not stages_for(scaled)[0][1].idle(flow)


async def test_a_tool_result_over_its_threshold_is_not_idle_even_far_under_the_window() -> None:
    cfg = config(tool_results={"threshold_tokens": 300})
    stages, *_ = stages_for(cfg)
    flow = make_flow(chat(*tool_turn(filler(400))), cfg=cfg)
    assert flow.report.tokens_before < 2000 and stages[1].idle(flow) and not stages[0].idle(flow)
    small = make_flow(chat(*tool_turn(filler(100))), cfg=cfg)
    assert stages[0].idle(small)


async def test_a_history_past_the_prepare_percent_is_not_idle_while_preparation_runs() -> None:
    cfg = config(tool_results={"enabled": False}, compaction={"prepare_percent": 50})
    stages, store, calls, engine = stages_for(cfg)
    history = chat(*[{"role": r, "content": filler(500, i)} for i, r in enumerate(["user", "assistant"] * 4)],
                   {"role": "user", "content": "next"})
    flow = make_flow(history, cfg=cfg)
    threshold = engine.budget(flow).threshold
    assert threshold * 0.5 < flow.report.tokens_before <= threshold
    assert stages[1].idle(flow)  # preparation not started: nothing would be queued
    engine.start()
    try:
        assert not stages[1].idle(flow)  # it would queue this conversation's summary ahead
        short = make_flow(chat({"role": "user", "content": "hi"}), cfg=cfg)
        assert stages[1].idle(short)
    finally:
        await engine.stop()


async def test_a_count_only_request_is_never_idle_for_compaction() -> None:
    cfg = config()
    stages, *_ = stages_for(cfg)
    flow = make_flow(chat({"role": "user", "content": "hi"}), cfg=cfg)
    flow.request.extra["count_only"] = True
    assert stages[0].idle(flow) and not stages[1].idle(flow)


async def test_stateful_and_natively_compacted_responses_are_idle_for_compaction_but_not_for_big_outputs() -> None:
    cfg = config(tool_results={"threshold_tokens": 300})
    stages, *_ = stages_for(cfg)
    adapter = ResponsesAdapter()
    big = [{"type": "function_call", "call_id": "c1", "name": "grep", "arguments": "{}"},
           {"type": "function_call_output", "call_id": "c1", "output": filler(400)}]
    for extra in ({"previous_response_id": "resp_1"}, {"context_management": [{"type": "compaction", "compact_threshold": 1000}]}):
        raw = orjson.dumps({"model": "gpt-4", "input": [{"role": "user", "content": filler(7000)}], **extra})
        flow = make_flow(raw=raw, adapter=adapter, cfg=cfg)
        assert flow.report.tokens_before > 6800 and stages[1].idle(flow)  # the history is not ours to compact
        raw = orjson.dumps({"model": "gpt-4", "input": big, **extra})
        assert not stages[0].idle(make_flow(raw=raw, adapter=adapter, cfg=cfg))  # its outputs still are


async def test_small_responses_and_messages_requests_are_idle_and_left_alone() -> None:
    cfg = config()
    bodies = [(ResponsesAdapter(), {"model": "gpt-4", "instructions": "Be terse.", "input": "What is 2+2?"}),
              (MessagesAdapter(), {"model": "gpt-4", "max_tokens": 64, "system": "Be terse.",
                                   "messages": [{"role": "user", "content": "What is 2+2?"}]})]
    for adapter, body in bodies:
        stages, store, calls, _ = stages_for(cfg)
        flow = make_flow(raw=orjson.dumps(body), adapter=adapter, cfg=cfg)
        assert all(s.idle(flow) for s in stages)
        await assert_left_alone(flow, stages, store, calls)
        assert flow.report == Report(flow.report.tokens_before, tokens_after=flow.report.tokens_after)


@pytest.mark.parametrize("percent", [0, 50, 80, 100])
async def test_the_kept_bounds_say_what_the_budget_and_the_preparer_say(percent: int) -> None:
    """leaves_alone keeps each model's threshold and preparing line (compared without asking the
    budget or the preparer again): every size around them gets the answer those two give."""
    cfg = config(tool_results={"enabled": False}, compaction={"prepare_percent": percent})
    stages, store, calls, engine = stages_for(cfg)
    base = make_flow(chat({"role": "user", "content": "x"}), cfg=cfg)
    threshold = engine.budget(base).threshold
    engine.start()
    try:
        seen = set()
        for words in range(0, threshold + 40, 37):
            flow = make_flow(chat({"role": "user", "content": "x" + " x" * words}), cfg=cfg)
            budget, total = engine.budget(flow), flow.request.total()
            plain = total <= budget.threshold and not engine.preparer.wants(flow, flow.forwarded, budget, total)
            for _ in range(2):  # (the first call may make the budget; the second finds its bounds)
                assert engine.leaves_alone(flow, flow.forwarded) is plain
            seen.add(plain)
        assert seen == {True, False}
    finally:
        await engine.stop()
