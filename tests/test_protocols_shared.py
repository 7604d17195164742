"""The chat path's reuse, isolation, failure and overflow behaviour, for every protocol that has it
alike (Chat Completions and Responses; tests/support/protocols.py speaks the same conversation in
each). The chat-only originals stay in test_isolation.py, test_compaction_flow.py and
test_reliability_faults.py; these run the same checks over the drivers."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from proxy.fakes.common import FakeError
from support.client import auth
from support.compaction_helpers import main_summary
from support.protocols import DRIVERS, Driver

SMALL = {"models": {"gpt-4": {"context_window": 6000}}, "compaction": {"prepare_percent": 0},
         "tool_results": {"threshold_tokens": 500}}


@pytest.fixture(params=DRIVERS, ids=lambda d: d.name)
def driver(request) -> Driver:
    return request.param


@pytest.fixture
async def fake(driver):
    f = driver.make_fake()
    await f.start()
    yield f
    await f.stop()


def numbered(driver: Driver, fake: Any) -> None:
    """History summaries and tool notes say which summarizer call made them."""
    calls = [0]

    def answer(arg: Any) -> str:
        calls[0] += 1
        if driver.summarizer_kind(fake, arg) == "tool":
            return f"[Summary of lookup output]\nnote-number-{calls[0]}\n## Key facts\n- fine\n## Original size\nbig\n"
        return main_summary(f"number-{calls[0]}")

    fake.summarizer = answer


def made_by(driver: Driver, fake: Any) -> set[str]:
    fwd = driver.forwarded_text(fake)
    summary = set(re.findall(r"summary-marker-number-(\d+)", fwd))
    note = set(re.findall(r"note-number-(\d+)", fwd))
    assert summary and len(note) == 1, fwd[:300]
    return summary | note


async def test_two_keys_share_nothing_and_each_reuses_its_own(driver, fake, make_proxy):
    numbered(driver, fake)
    proxy = await make_proxy(fake.base_url, SMALL)
    convo = driver.conversation()
    a = (await driver.send(proxy, convo, auth("sk-key-A"))).headers
    carried_a = made_by(driver, fake)
    b = (await driver.send(proxy, convo, auth("sk-key-B"))).headers
    carried_b = made_by(driver, fake)
    assert (a["x-compaction-status"], b["x-compaction-status"]) == ("summarized", "summarized")
    assert a["x-compaction-tool-results"] == b["x-compaction-tool-results"] == "1"
    assert carried_a.isdisjoint(carried_b)
    calls = len(fake.summarizer_requests)
    forwarded_a = None
    for key, carried in (("sk-key-A", carried_a), ("sk-key-B", carried_b)):
        h = (await driver.send(proxy, convo, auth(key))).headers
        assert h["x-compaction-status"] == "reused" and made_by(driver, fake) == carried
        if key == "sk-key-A":
            forwarded_a = fake.requests[-1].body
    assert len(fake.summarizer_requests) == calls  # reused: no new call
    # and byte for byte: A's third request forwards what its second did
    await driver.send(proxy, convo, auth("sk-key-A"))
    assert fake.requests[-1].body == forwarded_a


async def test_no_credential_keeps_and_reads_nothing(driver, fake, make_proxy):
    numbered(driver, fake)
    proxy = await make_proxy(fake.base_url, SMALL)
    convo = driver.conversation()
    for _ in range(2):
        h = (await driver.send(proxy, convo, {})).headers
        assert h["x-compaction-status"] == "failed-open" and h["x-compaction-tool-results"] == "0"
        assert driver.forwarded(fake) == convo
    assert fake.summarizer_requests == []


async def test_a_failing_summarizer_never_costs_the_request(driver, fake, make_proxy):
    fake.window = 100_000  # the original fits the upstream: failing open is safe
    fake.summarizer = FakeError.openai(500, "summarizer down")
    proxy = await make_proxy(fake.base_url, {**SMALL, "tool_results": {"enabled": False},
                                             "compaction": {"prepare_percent": 0, "failure_cooldown_s": 0,
                                                            "mask_tool_outputs": False, "digest_ttl_s": 0.05}})
    convo = driver.conversation()
    h = (await driver.send(proxy, convo, auth("sk-key-A"))).headers
    assert h["x-compaction-status"] in ("failed-open", "degraded")
    assert fake.records()[-1].status == 200  # answered
    numbered(driver, fake)  # the summarizer is back; the digest made meanwhile expires
    await asyncio.sleep(0.1)
    h = (await driver.send(proxy, convo, auth("sk-key-A"))).headers
    assert h["x-compaction-status"] == "summarized"


async def test_an_upstream_overflow_is_retried_compacted_once(driver, fake, make_proxy):
    numbered(driver, fake)
    fake.window = 5000  # smaller than the proxy believes
    proxy = await make_proxy(fake.base_url, {**SMALL, "models": {"gpt-4": {"context_window": 12000}},
                                             "tool_results": {"enabled": False}})
    convo = driver.conversation()
    answer = await driver.send(proxy, convo, auth("sk-key-A"))
    assert answer.headers["x-compaction-status"] == "summarized"
    model_calls = [r for r in fake.records() if r.kind in ("chat", "responses")]
    assert [r.status for r in model_calls] == [400, 200]  # the overflow, then the compacted retry
