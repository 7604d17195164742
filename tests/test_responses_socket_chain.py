"""A Responses WebSocket whose turns are chained (`previous_response_id`, store false), as Codex
sends them: the proxy reads each turn as the whole history it stands for, compacts it past the
threshold, sends that compacted history unchained, and chains the turns after it again
(proxy/protocols/responses/chain.py). Through the real proxy and the openai client against the strict fake
Responses upstream, which keeps only the socket's latest response for chaining and refuses a
reasoning item it cannot read back."""

from __future__ import annotations

import pytest

from proxy.fakes.responses import FakeResponses
from proxy.prompts import SUMMARY_HEADINGS
from support.careless import CarelessSummarizer
from support.client import openai_client
from support.compaction_helpers import filler, main_summary

MODEL = "gpt-5"
KEY = "sk-chain"


@pytest.fixture
async def fake():
    async with FakeResponses() as f:
        yield f


def _reply(view: dict) -> dict:
    # reasoning with every answer: with store false and no `include`, the upstream keeps it and
    # the client never gets it back readable (no encrypted_content)
    return {"content": "noted: " + filler(40, 1), "reasoning": "Think about it."}


class Socket:
    """One client socket: `turn(**body)` sends a response.create and returns its events."""

    def __init__(self, proxy) -> None:
        self.client = openai_client(proxy, KEY)

    async def __aenter__(self) -> "Socket":
        self._cm = self.client.responses.connect()
        self.conn = await self._cm.__aenter__()
        return self

    async def __aexit__(self, *exc) -> None:
        await self._cm.__aexit__(*exc)
        await self.client.close()

    async def turn(self, **body) -> list:
        await self.conn.response.create(**{"model": MODEL, "store": False, **body})
        events = []
        async for e in self.conn:
            events.append(e)
            if e.type in ("response.completed", "response.failed", "error"):
                return events


def _status(events) -> str:
    return events[0].response.metadata["x-compaction-status"]


def _question(t: int) -> list[dict]:
    return [{"type": "message", "role": "user", "content": f"question {t}: " + filler(200, t)}]


async def test_a_chained_history_is_compacted_once_then_chained_again(fake, make_proxy):
    fake.reply, fake.summarizer = _reply, main_summary("chain")
    proxy = await make_proxy(fake.base_url, {"models": {MODEL: {"context_window": 6000}},
                                             "compaction": {"prepare_percent": 0}})
    statuses, ids, sent = [], [], []
    async with Socket(proxy) as ws:
        events = await ws.turn(input=_question(0))
        for t in range(1, 20):
            assert events[-1].type == "response.completed", events[-1]  # every turn valid upstream
            statuses.append(_status(events))
            ids.append(events[-1].response.id)
            sent.append(_question(t))
            events = await ws.turn(previous_response_id=ids[-1], input=sent[-1])
            if statuses.count("reused") >= 2:
                break
    assert events[-1].type == "response.completed", events[-1]
    statuses.append(_status(events))
    assert "summarized" in statuses and statuses.count("reused") >= 2, statuses
    up = [r.json for r in fake.records("responses")]
    assert len(up) == len(statuses)
    cut = statuses.index("summarized")
    # Under the threshold: each chained turn went as the client sent it.
    for t in range(1, cut):
        assert up[t]["previous_response_id"] == ids[t - 1] and up[t]["input"] == sent[t - 1]
    # The turn that crossed it went whole: the history compacted, unchained, no reasoning it could
    # not read back (the fake refuses those) ...
    crossed = up[cut]
    assert "previous_response_id" not in crossed
    assert any("summary-marker-chain" in str(it.get("content")) for it in crossed["input"])
    assert all(it.get("type") != "reasoning" for it in crossed["input"])
    assert crossed["input"][-1] == sent[cut - 1][0]
    # ... and the turns after it chained again to the compacted response, with only their new
    # items (the summary is the upstream's from then on: reused, never resent).
    for t in range(cut + 1, len(up)):
        assert statuses[t] == "reused"
        assert up[t]["previous_response_id"] == ids[t - 1] and up[t]["input"] == sent[t - 1]
    # the summary was made (in one or more calls) for the crossing turn, and never again
    order = [r.kind for r in fake.requests if r.kind in ("responses", "summarizer")]
    first, n = order.index("summarizer"), order.count("summarizer")
    assert first == cut and order[first:first + n] == ["summarizer"] * n, order
    # What the proxy reports is the whole history's count, and what went upstream is smaller.
    last = events[0].response.metadata
    assert int(last["x-compaction-tokens-after"]) < int(last["x-compaction-tokens-before"])


TOOLS = [{"type": "function", "name": "run_tests", "description": "Run the tests.",
          "parameters": {"type": "object", "properties": {}}}]


def _runs_tests(view: dict) -> dict:
    return {"content": "Running them.", "tool_calls": [{"name": "run_tests", "arguments": "{}"}]}


def _test_run(t: int, events) -> list[dict]:
    """The test run the model asked for in `events`' response, as an agent answers it: a file path
    and an error line (what a careless summary drops), then filler."""
    [call] = [it for it in events[-1].response.output if it.type == "function_call"]
    out = [{"type": "function_call_output", "call_id": call.call_id,
            "output": f"FAILED src/pkg/module_{t}.py::test_checksum\nValueError: bad checksum {t}\n" + filler(200, t)}]
    if t % 3 == 0:  # the user steers now and then: the history has turns, not one long one
        out.append({"type": "message", "role": "user", "content": f"Good. Go on with module {t + 1}."})
    return out


@pytest.mark.parametrize("reply_every", [4, 2])
async def test_a_chained_history_compacted_through_a_careless_summarizer_keeps_what_it_dropped(
        fake, make_proxy, reply_every):
    """A chained socket session of test runs, as Codex sends it, with a summarizer that skips
    headings, drops identifiers and error lines, and replies instead of summarizing now and then
    (every 2nd call: each summary attempt fails, and the proxy falls back to its digest, within its
    budget, the rest left to recall): every turn stays valid, the crossing turn goes whole, with
    every heading and each file path and error line of the runs it replaced (or the digest, which
    starts with them and names its recall id), and the turns after it chain again."""
    fake.reply = _runs_tests
    fake.summarizer = careless = CarelessSummarizer(reply_every=reply_every)
    # (masking old test runs alone would fit this history: off, so that it is summarized)
    proxy = await make_proxy(fake.base_url, {"models": {MODEL: {"context_window": 6000}},
                                             "compaction": {"prepare_percent": 0, "mask_tool_outputs": False}})
    statuses, ids, sent = [], [], []
    async with Socket(proxy) as ws:
        sent.append([{"type": "message", "role": "user", "content": "Fix the failing tests."}])
        events = await ws.turn(input=sent[0], tools=TOOLS)
        for t in range(1, 24):
            assert events[-1].type == "response.completed", events[-1]  # every turn valid upstream
            statuses.append(_status(events))
            ids.append(events[-1].response.id)
            sent.append(_test_run(t, events))
            events = await ws.turn(previous_response_id=ids[-1], input=sent[-1], tools=TOOLS)
            if len(statuses) - next((i for i, st in enumerate(statuses) if st in ("summarized", "degraded")),
                                    len(statuses)) >= 3:
                break
    assert events[-1].type == "response.completed", events[-1]
    statuses.append(_status(events))
    assert careless.calls and (careless.replies or reply_every == 4)  # careless, and at 2 it replied
    cut = next(i for i, st in enumerate(statuses) if st in ("summarized", "degraded"))
    up = [r.json for r in fake.records("responses")]
    # Under the threshold (and while a failed summary is forwarded as it came): as the client sent it.
    for t in range(1, cut):
        assert up[t]["previous_response_id"] == ids[t - 1] and up[t]["input"] == sent[t]
    crossed = up[cut]
    assert "previous_response_id" not in crossed and crossed["input"][-len(sent[cut]):] == sent[cut]
    text = str(crossed["input"])
    summary = text[text.index("<summary>"):text.index("</summary>")]
    replaced = [t for t in range(1, cut) if f"bad checksum {t}\\n" not in text.replace(summary, "")]
    assert replaced, "nothing was summarized"
    if "## Digest of earlier messages" in summary:
        assert reply_every == 2  # the summarizer replied: the digest, written by code
        assert f"ValueError: bad checksum {replaced[0]}" in summary and "recall id" in summary
    else:
        for h in SUMMARY_HEADINGS:  # every heading, whatever the model skipped
            assert h in summary, h
        for t in replaced:  # each run it replaced: its file and its error line, verbatim
            assert f"src/pkg/module_{t}.py" in summary and f"ValueError: bad checksum {t}" in summary, t
    for t in range(cut + 1, len(up)):  # the same record applied again: chained, only the new items
        assert statuses[t] in ("reused", "degraded"), statuses
        assert up[t]["previous_response_id"] == ids[t - 1] and up[t]["input"] == sent[t]


async def test_a_turn_chained_past_what_the_socket_saw_goes_as_it_came(fake, make_proxy):
    """Chained to an older response (the upstream keeps only the latest: its error is relayed), the
    chain is forgotten: the next chained turn, valid at the upstream, goes untouched and uncounted,
    until the client sends a whole history again."""
    fake.reply = "ok"
    proxy = await make_proxy(fake.base_url, {"models": {MODEL: {"context_window": 6000}},
                                             "compaction": {"prepare_percent": 0}})
    async with Socket(proxy) as ws:
        first = await ws.turn(input=_question(0))
        second = await ws.turn(previous_response_id=first[-1].response.id, input=_question(1))
        assert _status(second) == "none" and second[0].response.metadata["x-compaction-tokens-before"] != "0"
        stale = await ws.turn(previous_response_id=first[-1].response.id, input=_question(2))
        assert stale[-1].type == "error" and "not found" in stale[-1].error.message
        again = await ws.turn(previous_response_id=second[-1].response.id, input=_question(3))
        assert again[-1].type == "response.completed"
        assert again[0].response.metadata["x-compaction-tokens-before"] == "0"  # not seen whole: not counted
        fresh = await ws.turn(input=_question(4))
        chained = await ws.turn(previous_response_id=fresh[-1].response.id, input=_question(5))
        assert chained[0].response.metadata["x-compaction-tokens-before"] != "0"  # a chain again
    up = [r.json for r in fake.records("responses")]
    assert up[2]["previous_response_id"] == first[-1].response.id and up[2]["input"] == _question(2)
    assert up[3]["previous_response_id"] == second[-1].response.id and up[3]["input"] == _question(3)


@pytest.mark.parametrize("overflow", ["error", "response.failed"])
async def test_a_chained_turn_the_upstream_finds_too_long_is_retried_whole_and_compacted(fake, make_proxy, overflow):
    """The upstream's window is smaller than the proxy believes: a chained turn under the proxy's
    threshold goes as it came and overflows; the retry is the whole history compacted, unchained,
    and the client's next turn chains to its response with only its new items."""
    fake.reply, fake.summarizer = "ok", main_summary("retry")
    fake.window = 3000
    fake.overflow_as_failed_event = overflow == "response.failed"
    proxy = await make_proxy(fake.base_url, {"models": {MODEL: {"context_window": 12000}},
                                             "compaction": {"prepare_percent": 0}})
    async with Socket(proxy) as ws:
        events = await ws.turn(input=_question(0))
        for t in range(1, 20):
            before = len(fake.records("responses"))
            events = await ws.turn(previous_response_id=events[-1].response.id, input=_question(t))
            assert events[-1].type == "response.completed", events[-1]  # the client never sees the overflow
            if len(fake.records("responses")) - before == 2:  # refused, then retried
                break
        else:
            pytest.fail("the upstream never refused a turn for length")
        retried_at = t
        assert _status(events) == "summarized"
        after = await ws.turn(previous_response_id=events[-1].response.id, input=_question(t + 1))
        assert after[-1].type == "response.completed", after[-1]
    up = [r for r in fake.records("responses")]
    refused, retried, nxt = up[-3], up[-2], up[-1]
    assert refused.json["previous_response_id"] and refused.json["input"] == _question(retried_at)  # as it came
    assert refused.prompt_tokens > 3000 >= retried.prompt_tokens
    assert "previous_response_id" not in retried.json
    assert any("summary-marker-retry" in str(it.get("content")) for it in retried.json["input"])
    assert nxt.json["previous_response_id"] == events[-1].response.id and nxt.json["input"] == _question(retried_at + 1)
