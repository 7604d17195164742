"""Observe mode (issue 42): every request goes upstream byte for byte as the client sent it, while
the stages run beside it and report what they would have done: notes and summaries made and
stored, journal events marked observed, the would-be figures on /metrics. For every protocol,
through the real proxy to its strict fake."""

from __future__ import annotations

import json
from typing import Any

import pytest

from support.client import post
from support.protocols import DRIVERS, MESSAGES, Driver, tool_conversation
from test_metrics import scrape, total, value
from test_protocols_shared import driver, fake  # noqa: F401  (the fixtures: each protocol and its fake)

WINDOW = 6000
LABEL = {"chat": "chat_completions", "responses": "responses", "messages": "messages", "gemini": "gemini"}  # the metrics' protocol


def settings(driver: Driver, fake: Any, **over: Any) -> dict[str, Any]:
    return driver.settings(fake, WINDOW, **{"compaction": {"prepare_percent": 0},
                                            "tool_results": {"threshold_tokens": 500}, **over})


def credential(driver: Driver, key: str = "sk-observe") -> dict[str, str]:
    return {"x-api-key": key} if driver is MESSAGES else {"Authorization": f"Bearer {key}"}


def turns() -> list[list[dict[str, Any]]]:
    """A session over its threshold from the first turn, growing by a turn each time."""
    convo = tool_conversation()
    out = [convo]
    for i in range(2):
        convo = convo + [{"role": "assistant", "content": f"Noted, step {i}."},
                         {"role": "user", "content": f"Go on with step {i + 1}."}]
        out.append(convo)
    return out


async def test_observe_mode_forwards_the_clients_bytes_and_reports_what_it_would_have_done(driver, fake, make_proxy):
    proxy = await make_proxy(fake.base_url, settings(driver, fake, mode="observe"))
    for messages in turns():
        sent = driver.raw_body(messages)
        answer = await driver.send_raw(proxy, messages, credential(driver))
        assert answer.headers["x-compaction-status"] == "observed"
        assert answer.headers["x-compaction-reason"] == "observe"
        assert driver.model_calls(fake)[-1].body == sent  # byte for byte
        await proxy.state.watcher.idle()
    assert fake.summarizer_requests  # the summary and the note were made beside the requests
    await proxy.state.journal.flush()
    events = await proxy.state.journal.recent(20)
    assert events and all(e["observed"] for e in events)
    assert "summarized" in {e["tier"] for e in events}
    m = await scrape(proxy)
    protocol = LABEL[driver.name]
    assert value(m, "compaction_proxy_observed_requests_total", protocol=protocol, status="summarized") == 1
    assert value(m, "compaction_proxy_observed_requests_total", protocol=protocol, status="reused") == 2
    assert value(m, "compaction_proxy_observed_tokens_saved_total", protocol=protocol) > 3 * 1000
    assert value(m, "compaction_proxy_answer_reasons_total", protocol=protocol, reason="observe") == 3
    assert total(m, "compaction_proxy_compactions_total") == 0  # nothing was compacted for real


async def test_a_client_asks_for_observe_mode_and_later_requests_reuse_what_it_made(driver, fake, make_proxy):
    """Per request (`x-compaction-mode: observe`) through the real client; the summary made while
    observing serves the first request that is compacted for real, with no summarizer call."""
    proxy = await make_proxy(fake.base_url, settings(driver, fake))
    convo = tool_conversation()
    observed = await driver.send(proxy, convo, headers={"x-compaction-mode": "observe"})
    assert observed.status == "observed"
    assert driver.forwarded(fake) == driver.conversation_of(driver.body(convo))  # the client's history, untouched
    await proxy.state.watcher.idle()
    calls = len(fake.summarizer_requests)
    assert calls
    active = await driver.send(proxy, convo)
    assert active.status == "reused" and "x-compaction-reason" not in active.headers
    assert len(fake.summarizer_requests) == calls
    assert driver.forwarded(fake) != driver.conversation_of(driver.body(convo))


async def test_the_prices_of_the_would_be_savings(make_proxy):
    """A priced model's would-be savings in dollars: the saved tokens at its input price."""
    driver = DRIVERS[0]
    async with driver.make_fake() as fake:
        prices = {"prices": {driver.model: {"input": 30.0, "output": 60.0}}}
        proxy = await make_proxy(fake.base_url, settings(driver, fake, mode="observe", billing=prices))
        await driver.send_raw(proxy, tool_conversation(), credential(driver))
        await proxy.state.watcher.idle()
        m = await scrape(proxy)
        saved = value(m, "compaction_proxy_observed_tokens_saved_total", protocol="chat_completions")
        price = proxy.state.bill.prices.find(driver.model)
        assert price is not None and saved > 0
        assert value(m, "compaction_proxy_observed_cost_saved_usd_total", protocol="chat_completions") == pytest.approx(
            saved * 30.0 / 1e6)


async def test_an_observed_token_count_counts_what_is_sent(make_proxy):
    """Claude Code decides its own compaction from count_tokens: observed, the count is of the
    client's body as it came (what observe mode forwards), and nothing is made for it."""
    async with MESSAGES.make_fake() as fake:
        proxy = await make_proxy(fake.base_url, settings(MESSAGES, fake, mode="observe"))
        convo = tool_conversation()
        sent = json.dumps({k: v for k, v in MESSAGES.body(convo).items() if k != "max_tokens"}).encode()
        answer = await post(proxy, sent, {**credential(MESSAGES), "anthropic-version": "2023-06-01",
                                          "Content-Type": "application/json"}, path="/messages/count_tokens", expect=200)
        assert (answer.headers["x-compaction-status"], answer.headers["x-compaction-reason"]) == ("observed", "observe")
        (counted,) = [r for r in fake.records() if r.kind == "count_tokens"]
        assert counted.body == sent
        await proxy.state.watcher.idle()
        assert fake.summarizer_requests == []
