"""A reason for every answer (issue 42): each answer whose history was not compacted says why, in
one word of a bounded set, on `x-compaction-reason`; the same word in the access line, the
journal and the `compaction_proxy_answer_reasons_total` metric. Each reason is reached through
the real proxy against the strict fakes."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from proxy.flow import Flow, Stage
from proxy.ops import reasons
from support.client import anthropic_client, post
from support.compaction_helpers import chat_history, filler
from support.protocols import CHAT, MESSAGES, RESPONSES, Driver, tool_conversation
from support.waiting import DEADLINE_S
from test_metrics import scrape, value

WINDOW = 6000
AUTH = {"Authorization": "Bearer sk-reasons"}


def settings(driver: Driver, fake: Any, window: int = WINDOW, **over: Any) -> dict[str, Any]:
    return driver.settings(fake, window, **{"compaction": {"prepare_percent": 0},
                                            "tool_results": {"threshold_tokens": 500}, **over})


def auth(driver: Driver) -> dict[str, str]:
    return {"x-api-key": "sk-reasons"} if driver is MESSAGES else AUTH


async def reason_of(driver: Driver, proxy: Any, messages: list[dict[str, Any]], headers: dict[str, str] | None = None,
                    ) -> tuple[str, str | None]:
    answer = await driver.send_raw(proxy, messages, {**auth(driver), **(headers or {})} if headers is None or
                                   "anonymous" not in headers else {})
    return answer.headers["x-compaction-status"], answer.headers.get("x-compaction-reason")


@pytest.fixture
async def chat_fake():
    f = await CHAT.start_fake()
    yield f
    await f.stop()


async def test_under_the_threshold_the_word_is_on_the_answer_the_access_line_and_the_metric(chat_fake, make_proxy,
                                                                                              caplog):
    proxy = await make_proxy(chat_fake.base_url, settings(CHAT, chat_fake))
    with caplog.at_level(logging.INFO, logger="proxy.access"):
        assert await reason_of(CHAT, proxy, chat_history(1, 10)) == ("none", reasons.BELOW_THRESHOLD)
        proxy.state.hooks.settle()
    (line,) = [r for r in caplog.records if r.name == "proxy.access"]
    assert line.fields["reason"] == reasons.BELOW_THRESHOLD  # type: ignore[attr-defined]
    m = await scrape(proxy)
    assert value(m, "compaction_proxy_answer_reasons_total", protocol="chat_completions",
                 reason=reasons.BELOW_THRESHOLD) == 1


async def test_a_compaction_has_no_reason(chat_fake, make_proxy):
    proxy = await make_proxy(chat_fake.base_url, settings(CHAT, chat_fake))
    status, why = await reason_of(CHAT, proxy, tool_conversation())
    assert (status, why) == ("summarized", None)


async def test_disabled_bypass_and_anonymous(chat_fake, make_proxy):
    off = await make_proxy(chat_fake.base_url, settings(CHAT, chat_fake, compaction={"enabled": False}))
    assert await reason_of(CHAT, off, tool_conversation()) == ("none", reasons.DISABLED)
    proxy = await make_proxy(chat_fake.base_url, settings(CHAT, chat_fake))
    assert await reason_of(CHAT, proxy, tool_conversation(), {"x-compaction-bypass": "1"}) == ("bypassed", reasons.BYPASS)
    assert await reason_of(CHAT, proxy, tool_conversation(), {"anonymous": ""}) == ("failed-open", reasons.ANONYMOUS)
    # anonymous and under the threshold: nothing would have been done anyway
    assert await reason_of(CHAT, proxy, chat_history(1, 10), {"anonymous": ""}) == ("none", reasons.BELOW_THRESHOLD)


async def test_summarizer_failed_then_cooldown_with_the_word_in_the_journal(chat_fake, make_proxy):
    chat_fake.summarizer = CHAT.error(500, "the summarizer is down")
    proxy = await make_proxy(chat_fake.base_url, settings(CHAT, chat_fake, tool_results={"enabled": False}))
    convo = chat_history(12, 150)
    assert await reason_of(CHAT, proxy, convo) == ("failed-open", reasons.SUMMARIZER_FAILED)
    assert await reason_of(CHAT, proxy, convo) == ("failed-open", reasons.COOLDOWN)
    await proxy.state.journal.flush()
    events = await proxy.state.journal.recent(10)
    assert [e["why"] for e in events] == [reasons.COOLDOWN, reasons.SUMMARIZER_FAILED]  # newest first


async def test_no_cut_point(chat_fake, make_proxy):
    """One user message over the threshold (but within the window): nothing older to summarize."""
    proxy = await make_proxy(chat_fake.base_url, settings(CHAT, chat_fake))
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": filler(5000)}]
    assert await reason_of(CHAT, proxy, messages) == ("failed-open", reasons.NO_CUT)


async def test_not_smaller(chat_fake, make_proxy):
    """The history before the newest turn is tiny: its summary would not make the request smaller."""
    chat_fake.window = 100_000
    proxy = await make_proxy(chat_fake.base_url, settings(CHAT, chat_fake, compaction={
        "prepare_percent": 0, "keep_recent_tokens": 0}))
    messages = chat_history(2, 10)
    messages[-1]["content"] = "Read this: " + filler(5000)
    assert await reason_of(CHAT, proxy, messages) == ("failed-open", reasons.NOT_SMALLER)


async def test_breaker_open(chat_fake, make_proxy):
    """The tool-result summarizer failed until its breaker opened: the outputs go raw, and the
    answer says so (the history is under its threshold)."""
    chat_fake.summarizer = CHAT.error(500, "the summarizer is down")
    proxy = await make_proxy(chat_fake.base_url, settings(CHAT, chat_fake, window=50_000,
                                                          tool_results={"threshold_tokens": 500, "breaker_failures": 1}))
    assert await reason_of(CHAT, proxy, tool_conversation()) == ("none", reasons.BREAKER_OPEN)


async def test_internal_error(chat_fake, make_proxy):
    proxy = await make_proxy(chat_fake.base_url, settings(CHAT, chat_fake))

    class Broken(Stage):
        async def request(self, flow: Flow) -> None:
            raise RuntimeError("a bug in the stage")

    proxy.state.stages[1] = Broken()
    assert await reason_of(CHAT, proxy, tool_conversation()) == ("failed-open", reasons.INTERNAL)


async def test_busy_when_another_replicas_summary_is_late(chat_fake, make_proxy, tmp_path):
    """Two replicas on one store: the second waits for the first's summary past max_wait_s."""
    chat_fake.summarizer_delay_s = 3.0
    store = {"url": f"sqlite:///{tmp_path / 'store.db'}"}
    a = await make_proxy(chat_fake.base_url, settings(CHAT, chat_fake, store=store, tool_results={"enabled": False}))
    b = await make_proxy(chat_fake.base_url, settings(CHAT, chat_fake, store=store, tool_results={"enabled": False},
                                                      compaction={"prepare_percent": 0, "max_wait_s": 0.2}))
    convo = chat_history(12, 150)
    first = asyncio.create_task(reason_of(CHAT, a, convo))
    async with asyncio.timeout(DEADLINE_S):
        while not chat_fake.summarizer_requests:  # a's summary is being made (its lock is held)
            await asyncio.sleep(0.02)
    assert await reason_of(CHAT, b, convo) == ("failed-open", reasons.BUSY)
    assert await first == ("summarized", None)


async def test_stateful_and_native_compaction_on_responses(make_proxy):
    async with RESPONSES.make_fake() as fake:
        proxy = await make_proxy(fake.base_url, settings(RESPONSES, fake))
        first = await RESPONSES.send_raw(proxy, chat_history(1, 10), AUTH)
        assert first.headers["x-compaction-reason"] == reasons.BELOW_THRESHOLD
        body = {**RESPONSES.body([{"role": "user", "content": "And then?"}]), "previous_response_id": first.json()["id"]}
        chained = await post(proxy, json.dumps(body).encode(), {**AUTH, "Content-Type": "application/json"},
                             path="/responses", expect=200)
        assert (chained.headers["x-compaction-status"], chained.headers["x-compaction-reason"]) == ("none",
                                                                                                 reasons.STATEFUL)
        native = await RESPONSES.send(proxy, tool_conversation(),
                                      extra_body={"context_management": [{"type": "compaction", "compact_threshold": 4000}]})
        assert native.headers["x-compaction-reason"] == reasons.NATIVE


async def test_a_token_count_over_the_threshold_makes_nothing(make_proxy):
    async with MESSAGES.make_fake() as fake:
        proxy = await make_proxy(fake.base_url, settings(MESSAGES, fake, tool_results={"enabled": False}))
        system, messages = MESSAGES.body(chat_history(12, 150))["system"], MESSAGES.body(chat_history(12, 150))["messages"]
        async with anthropic_client(proxy, None, default_headers={"x-api-key": "sk-reasons"}) as c:
            raw = await c.messages.with_raw_response.count_tokens(model=MESSAGES.model, system=system, messages=messages)
        assert (raw.headers["x-compaction-status"], raw.headers["x-compaction-reason"]) == ("none", reasons.COUNT)


def test_a_reason_read_back_from_an_answer_is_one_of_ours():
    assert reasons.word("below-threshold") == reasons.BELOW_THRESHOLD
    assert reasons.word("anything\nelse") == ""
    assert reasons.unchanged(False, True, reasons.ANONYMOUS) == reasons.DISABLED
    assert reasons.unchanged(True, False, reasons.ANONYMOUS) == reasons.BELOW_THRESHOLD
    assert reasons.unchanged(True, True, reasons.ANONYMOUS) == reasons.ANONYMOUS
