"""Tenants apart (issue 38): one credential's bad key or slow summaries cost only that credential.
The real proxy, the real openai client, the strict fake upstream on loopback."""

from __future__ import annotations

import asyncio

from support.client import auth, chat, post
from support.compaction_helpers import main_summary
from support.waiting import until
from test_compaction_flow import longer_than
from test_compaction_flow import settings as compaction_settings
from test_tool_results_flow import conversation, log_payload, settings

GOOD, REVOKED = "sk-tenant-good", "sk-tenant-revoked"
SLOW_MARK = "slow-tenant-conversation"


class Gated:
    """A summarizer that holds the slow tenant's calls (marked SLOW_MARK) until `gate` is set."""

    def __init__(self, reply: str) -> None:
        self.reply = reply
        self.gate = asyncio.Event()
        self.slow_in_flight = 0

    async def __call__(self, body: dict) -> str:
        if SLOW_MARK in body["messages"][1]["content"]:
            self.slow_in_flight += 1
            await self.gate.wait()
        return self.reply


def marked(mark: str) -> list[dict]:
    """A history over a 6000-token window's threshold, its first message carrying `mark`."""
    msgs = longer_than(5100)
    msgs[1] = {**msgs[1], "content": f"{mark}: {msgs[1]['content']}"}
    return msgs


async def test_a_revoked_key_opens_the_tool_result_breaker_for_its_own_scope_only(upstream, make_proxy, client_for):
    upstream.require_api_key = GOOD  # the other key was revoked: every call made with it gets 401
    proxy = await make_proxy(upstream.base_url, settings())
    for n in range(3):  # the breaker's three failures, all the revoked key's
        body = {"model": "gpt-4", "messages": conversation(log_payload(tag=f"r{n}"), call_id=f"call_r{n}")}
        await post(proxy, body, auth(REVOKED), expect=401)
    assert len(upstream.tool_summarizer_requests) == 3
    assert proxy.state.tool_results.breaker_states() == [("gpt-4", "open")]
    # The revoked scope's breaker is open: its next output is not sent to the summarizer.
    body = {"model": "gpt-4", "messages": conversation(log_payload(tag="r3"), call_id="call_r3")}
    await post(proxy, body, auth(REVOKED), expect=401)
    assert len(upstream.tool_summarizer_requests) == 3
    # Another tenant's output is still noted.
    _, headers, _ = await chat(client_for(proxy, GOOD), conversation(log_payload(tag="g")))
    assert headers["x-compaction-tool-results"] == "1"
    assert len(upstream.tool_summarizer_requests) == 4


async def test_breakers_kept_are_capped(upstream, make_proxy):
    upstream.fault_target, upstream.fail_status = "summarizer", 500
    proxy = await make_proxy(upstream.base_url, settings(max_breakers=2))
    for n in range(4):  # four scopes, one failure each
        body = {"model": "gpt-4", "messages": conversation(log_payload(tag=f"k{n}"), call_id=f"call_k{n}")}
        await post(proxy, body, auth(f"sk-tenant-{n}"), expect=200)
    assert len(proxy.state.tool_results._breakers) == 2


async def test_one_scopes_slow_summaries_leave_slots_to_another(upstream, make_proxy, client_for):
    """Eight conversations of one key wait on a summarizer that does not answer them (the global
    limit's worth); another key's compaction is made meanwhile."""
    upstream.summarizer = gated = Gated(main_summary())
    proxy = await make_proxy(upstream.base_url, compaction_settings(6000, max_concurrent_summaries=8))
    slow_client = client_for(proxy, "sk-tenant-slow")
    slow = [asyncio.create_task(chat(slow_client, marked(f"{SLOW_MARK} {n}"))) for n in range(8)]
    try:
        await until(lambda: gated.slow_in_flight >= 4, "the slow tenant's calls to fill its slots")
        status, _, _ = await chat(client_for(proxy, "sk-tenant-quick"), marked("quick tenant"))
        assert status == "summarized"
        assert gated.slow_in_flight == 4  # the slow tenant's other four wait for its own slots
    finally:
        gated.gate.set()
    assert [r[0] for r in await asyncio.gather(*slow)] == ["summarized"] * 8
    assert gated.slow_in_flight == 8


async def test_one_scopes_slow_tool_notes_leave_slots_to_another(upstream, make_proxy, client_for):
    """Four oversized outputs of one key whose notes the summarizer does not answer (the global
    limit's worth); another key's output is noted meanwhile."""
    upstream.summarizer = gated = Gated("Short note: the worker failed; see the identifiers.")
    proxy = await make_proxy(upstream.base_url, settings())
    slow_client = client_for(proxy, "sk-tenant-slow")
    slow = [asyncio.create_task(chat(slow_client, conversation(log_payload(tag=f"{SLOW_MARK}{n}"), call_id=f"call_s{n}")))
            for n in range(4)]
    try:
        await until(lambda: gated.slow_in_flight >= 2, "the slow tenant's notes to fill its slots")
        _, headers, _ = await chat(client_for(proxy, "sk-tenant-quick"), conversation(log_payload(tag="quick")))
        assert headers["x-compaction-tool-results"] == "1"
        assert gated.slow_in_flight == 2  # the slow tenant's other two wait for its own slots
    finally:
        gated.gate.set()
    assert [r[1]["x-compaction-tool-results"] for r in await asyncio.gather(*slow)] == ["1"] * 4
