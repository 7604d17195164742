"""A made-up protocol, "toylog", through the real stages (issue 13): its adapter is a few lines, and
the tool-result stage and history compaction serve it unchanged, which shows that the stages know
no protocol. No HTTP: the flow is built in the test, the upstream is a scripted caller.

A toylog body: {"model": str, "log": [[who, text, ref, tool], ...]} where `who` is "sys" (the
system prompt), "ask" (the user), "say" (the assistant), "run" (a tool call: text = arguments, ref
= call id, tool = its name) or "got" (a tool's result for `ref`).
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.adapter import Adapter, Request, SummaryCall, SummaryRequest
from proxy.compaction.engine import CompactionEngine
from proxy.compaction.stage import CompactionStage
from proxy.compaction.summarizer import HistorySummarizer
from proxy.config import Config
from proxy.flow import Flow, Identity, run_request
from proxy.model import Conversation, Envelope, Injected, Item, Kind, name_results
from proxy.ops.hooks import Hooks
from proxy.prompts import Prompts
from proxy.store.memory import MemoryStore
from proxy.toolresults.stage import ToolResultStage
from support.compaction_helpers import counter, filler, main_summary

KINDS = {"sys": Kind.SYSTEM, "ask": Kind.USER, "say": Kind.ASSISTANT, "run": Kind.TOOL_CALL, "got": Kind.TOOL_RESULT}


class ToyLog(Adapter):
    protocol, upstream_path, credential_headers = "toylog", "/toylog", ("authorization",)

    def envelope(self, entry: list[Any]) -> Envelope:
        who, text, ref, tool = (entry + [None, None])[:4]
        item = Item(KINDS[who], text, call_id=ref, name=tool, args=text if who == "run" else "")
        return Envelope((item,), 0, who in ("ask", "say", "run"), entry)

    def parse(self, raw: bytes, counter: Any, cfg: Config, *, ratio: float | None = None) -> Request:
        body = orjson.loads(raw)
        written = [orjson.dumps(e) for e in body["log"]]
        envs = [self.envelope(e) for e in body["log"]]
        named = name_results([e.items[0] for e in envs])
        envs = [Envelope((it,), 0, e.cut_before, e.value) for e, it in zip(envs, named)]
        conv = Conversation(envs, [self.count(e, "cl100k_base", counter) for e in envs])
        return Request(raw=raw, body=body, model=body["model"], stream=False, conversation=conv,
                       keys=[hash(w) for w in written], written=written, encoding="cl100k_base", ratio=1.0)

    def render(self, request: Request, forwarded: Conversation) -> bytes:
        return request.raw if forwarded is request.conversation else orjson.dumps({**request.body, "log": forwarded.values})

    def with_output(self, envelope: Envelope, item: int, text: str) -> Envelope:
        return self.envelope([envelope.value[0], text, *envelope.value[2:]])

    def inject(self, conv: Conversation, cut: int, summary: str, annotation: str) -> Injected:
        system = self.envelope(["sys", conv.envelopes[0].value[1] + "\n\n" + annotation])
        return Injected([system, self.envelope(["ask", summary]), *conv.envelopes[cut:]], 2, cut)

    def count(self, envelope: Envelope, encoding: str, counter: Any) -> int:
        return 3 + counter.count_text(envelope.value[1], encoding)

    def is_overflow(self, status: int, body: bytes) -> bool:
        return status == 400 and b"too long" in body

    def summary_request(self, call: SummaryCall, base_url: str) -> SummaryRequest:
        log = [*(call.prefix or [["sys", call.system]]), ["ask", call.prompt]]
        return SummaryRequest(call, base_url, self.upstream_path, orjson.dumps({"model": call.model, "log": log}))

    def summary_text(self, status: int, answer: bytes, usage: dict[str, Any] | None = None) -> str:
        return orjson.loads(answer)["log"][-1][1]


class Scripted:
    """The upstream's summarizer calls, asked in toylog (the adapter renders them, and reads the
    answer): a short note for a tool result, a valid summary for the history."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def complete(self, adapter: Adapter, call: SummaryCall, **_: Any) -> str:
        log = orjson.loads(adapter.summary_request(call, "http://toy").body)["log"]
        self.calls.append(log[0][1][:40])
        if "--- BEGIN TOOL OUTPUT ---" in log[-1][1]:
            text = "[Summary of grep output]\nthree matches in src/app.py"
        else:
            text = main_summary(str(len(self.calls)))
        return adapter.summary_text(200, orjson.dumps({"log": [["say", text]]}))


def toy_log(turns: int) -> list[list[Any]]:
    log: list[list[Any]] = [["sys", "You are a toy agent."]]
    for t in range(turns):
        log += [["ask", f"question {t}: " + filler(120, t)], ["run", '{"q": "x"}', f"c{t}", "grep"],
                ["got", f"output {t}: " + filler(1200 if t % 3 == 0 else 150, t), f"c{t}"],
                ["say", f"answer {t}: " + filler(120, t + 1)]]
    return log + [["ask", "what next?"]]


async def test_a_made_up_protocol_gets_tool_notes_and_a_reused_summary_from_the_same_stages():
    cfg = Config.model_validate({"models": {"toy": {"context_window": 6000}}, "tool_results": {"threshold_tokens": 800},
                                 "compaction": {"prepare_percent": 0, "cached_summary_call": False}})
    store, caller, prompts = MemoryStore(ttl_s=3600, max_records=1000), Scripted(), Prompts()
    engine = CompactionEngine(cfg, store, HistorySummarizer(caller, prompts, lambda t: counter().count_text(t, "cl100k_base")),
                              counter(), prompts)
    stages = [ToolResultStage(cfg, store, caller, prompts, counter()), CompactionStage(engine, Hooks())]
    toy = ToyLog()

    async def send(log: list[list[Any]]) -> tuple[Flow, list[list[Any]]]:
        raw = orjson.dumps({"model": "toy", "log": log})
        flow = Flow.of(toy, toy.parse(raw, counter(), cfg), Identity("scope", {"authorization": "Bearer k"}))
        await run_request(stages, flow)
        return flow, orjson.loads(flow.body())["log"]

    log = toy_log(12)
    flow, forwarded = await send(log)
    assert flow.report.status == "summarized" and flow.report.tool_results == 4  # outputs 0, 3, 6, 9
    assert flow.report.tokens_after is not None and flow.report.tokens_after < 0.8 * 5100 < flow.report.tokens_before
    assert forwarded[0][0] == "sys" and forwarded[0][1].startswith("You are a toy agent.") and len(forwarded[0][1]) > 30
    assert forwarded[1][0] == "ask" and "<summary>" in forwarded[1][1] and forwarded[-1] == ["ask", "what next?"]
    for k, (who, _, *ref) in enumerate(forwarded):  # every kept result right after its call
        if who == "got":
            assert forwarded[k - 1][0] == "run" and forwarded[k - 1][2] == ref[0]
    notes = [e for e in forwarded if e[0] == "got" and e[1].startswith("[Summary of grep output]")]
    assert notes and all(e[1].endswith("src/app.py") for e in notes)

    calls = len(caller.calls)
    again, forwarded_again = await send([*log, ["say", "ok"], ["ask", "and then?"]])
    assert again.report.status == "reused" and len(caller.calls) == calls  # stored record and notes reused
    assert forwarded_again[: len(forwarded) - 1] == forwarded[:-1]  # the forwarded prefix only grows
