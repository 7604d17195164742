"""The forwarded-request invariant (issue 7 item 2) as a property, through the real proxy over HTTP:
random agent conversations (text turns, parallel tool calls, oversized tool outputs, content parts)
under random windows, thresholds, kept-tail budgets and tool-result thresholds; EVERY request the
fake upstream receives (the overflow retry's included) goes through `check_forwarded`.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import orjson
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from proxy.fakes.chat import FakeUpstream
from support.client import auth, post
from support.compaction_helpers import filler, text_of
from support.invariants import check_forwarded
from support.proxy_server import start_proxy

MODEL = "gpt-4"
BOUND_S = 30


def _content(draw: Any, words: int, seed: int) -> Any:
    text = f"[{seed}] " + filler(words, seed)
    return [{"type": "text", "text": text}] if draw(st.booleans()) else text


@st.composite
def conversations(draw: Any) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    seed = 0
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": "You are an agent. " + filler(draw(st.integers(0, 600)), 99)})
    call = 0
    for _ in range(draw(st.integers(1, 8))):
        seed += 1
        msgs.append({"role": "user", "content": _content(draw, draw(st.integers(1, 300)), seed)})
        for _ in range(draw(st.integers(0, 3))):  # an agent loop: tool calls, their results
            ids = [f"call_{call + k}" for k in range(draw(st.integers(1, 3)))]
            call += len(ids)
            msgs.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": i, "type": "function", "function": {"name": f"tool_{i[-1]}", "arguments": '{"q": 1}'}}
                for i in ids]})
            for i in ids:
                seed += 1
                lines = draw(st.integers(1, 300))
                msgs.append({"role": "tool", "tool_call_id": i,
                             "content": "\n".join(f"{i} row {n}: {filler(8, seed + n)}" for n in range(lines))})
        if draw(st.booleans()):
            seed += 1
            msgs.append({"role": "assistant", "content": _content(draw, draw(st.integers(1, 300)), seed)})
    if msgs[-1]["role"] == "assistant" and draw(st.booleans()):
        msgs.append({"role": "user", "content": "continue"})
    return msgs


setups = st.fixed_dictionaries({
    "window": st.integers(2000, 16000),
    "threshold_percent": st.none() | st.integers(40, 95),
    "keep_recent_tokens": st.integers(0, 6000),
    "tool_threshold": st.integers(100, 3000),
    "upstream_window": st.sampled_from(["same", "large"]),
    "stream": st.booleans(),
})


def _compacted(original: list[dict[str, Any]], forwarded: list[dict[str, Any]]) -> bool:
    sent = any("<summary>" in text_of(m.get("content")) for m in original)
    return not sent and any(m["role"] == "user" and "<summary>" in text_of(m.get("content")) for m in forwarded)


async def _one_request(messages: list[dict[str, Any]], setup: dict[str, Any]) -> list[str]:
    """One conversation through a fresh proxy and fake upstream; what it exercised, for the tally."""
    async with FakeUpstream() as upstream:
        upstream.window = setup["window"] if setup["upstream_window"] == "same" else 1_000_000
        compaction = {"prepare_percent": 0, "keep_recent_tokens": setup["keep_recent_tokens"]}
        if setup["threshold_percent"] is not None:
            compaction["threshold_percent"] = setup["threshold_percent"]
        proxy = await start_proxy(upstream.base_url, {
            "models": {MODEL: {"context_window": setup["window"]}},
            "compaction": compaction,
            "tool_results": {"threshold_tokens": setup["tool_threshold"]},
        })
        try:
            body = {"model": MODEL, "messages": messages, "stream": setup["stream"]}
            # with a credential: an anonymous request is never compacted (the property never got
            # past "none" and "failed-open" without one)
            status, headers, _ = await post(proxy, orjson.dumps(body), auth(), timeout=BOUND_S)
        finally:
            await proxy.close()
        forwarded = upstream.records("chat")
    tier, notes = headers["x-compaction-status"], int(headers["x-compaction-tool-results"]) > 0
    event(f"status {tier}, HTTP {status}")  # --hypothesis-show-statistics
    event(f"tool results as notes: {notes}")
    event(f"overflow retry: {len(forwarded) == 2}")
    # a valid forward, or the upstream's own length error when even compaction could not fit it
    assert status == 200 or (status == 400 and setup["upstream_window"] == "same"), status
    assert 1 <= len(forwarded) <= 2  # at most one overflow retry
    for rec in forwarded:
        check_forwarded(messages, rec.json["messages"], compacted=_compacted(messages, rec.json["messages"]))
    last = forwarded[-1].json["messages"]
    if tier in ("summarized", "reused", "degraded"):  # (degraded: a digest written by code in the summary's place)
        assert _compacted(messages, last)
    else:  # none, masked, or failed-open: no summary (tool results may still be notes)
        assert not _compacted(messages, last)
    return [tier] + ["notes"] * notes + ["retry"] * (len(forwarded) == 2)


def test_every_forwarded_request_keeps_the_invariant():
    seen: Counter[str] = Counter()

    @settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(messages=conversations(), setup=setups)
    def one(messages: list[dict[str, Any]], setup: dict[str, Any]) -> None:
        seen.update(asyncio.run(_one_request(messages, setup)))

    one()
    # The invariant was checked where it matters: on compacted forwards and on tool-result notes.
    assert seen["summarized"] and seen["notes"], seen
