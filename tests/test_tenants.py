"""Tenants apart (issue 38): one credential's bad key or slow summaries cost only that credential.
The real proxy, the real openai client, the strict fake upstream on loopback."""

from __future__ import annotations

from support.client import auth, chat, post
from test_tool_results_flow import conversation, log_payload, settings

GOOD, REVOKED = "sk-tenant-good", "sk-tenant-revoked"


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
