"""The prefix-break alarm (issue 42): a counter of forwarded requests whose start differs from
their conversation's previous forwarded request outside a compaction, on /metrics with the
conversation in the journal. A growing session and a compacting one keep it at 0; a client that
rewrites an old message raises it. Every protocol, through the real proxy."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from proxy.ops.prefix_alarm import first_difference
from support.compaction_helpers import chat_history, compacting_session
from support.client import post
from support.protocols import MESSAGES, Driver
from test_metrics import scrape, value
from test_observe_mode import LABEL, credential
from test_protocols_shared import driver, fake  # noqa: F401  (the fixtures: each protocol and its fake)


def grown(messages: list[dict[str, Any]], i: int) -> list[dict[str, Any]]:
    return messages + [{"role": "assistant", "content": f"Done with part {i}."},
                       {"role": "user", "content": f"Now part {i + 1}."}]


async def breaks(proxy: Any, driver: Driver) -> float:
    return value(await scrape(proxy), "compaction_proxy_prefix_breaks_total", protocol=LABEL[driver.name])


@pytest.mark.parametrize("words", [40, 600], ids=["small", "reused-parse"])
async def test_a_growing_session_never_breaks_and_a_rewritten_message_does(driver, fake, make_proxy, words):
    """`reused-parse`: bodies past prefix reuse's size, whose shared messages are not compared again."""
    proxy = await make_proxy(fake.base_url, driver.settings(fake, 200_000))
    messages = chat_history(6, words)
    for i in range(4):
        messages = grown(messages, i)
        answer = await driver.send_raw(proxy, messages, credential(driver))
        assert answer.headers["x-compaction-status"] == "none"
    assert await breaks(proxy, driver) == 0
    rewritten = copy.deepcopy(grown(messages, 9))
    rewritten[3]["content"] += " (edited later by the client)"
    answer = await driver.send_raw(proxy, rewritten, credential(driver))
    assert await breaks(proxy, driver) == 1
    await proxy.state.journal.flush()
    (event,) = [e for e in await proxy.state.journal.recent(10) if e["tier"] == "prefix-break"]
    assert event["request_id"] == answer.headers["x-request-id"] and event["conversation"]
    # the message the client rewrote, counted from 1 with the system part first (Messages' own field)
    assert "from message 4 on" in event["reason"]


async def test_a_compacting_session_does_not_break(driver, fake, make_proxy):
    """A session that grows past its threshold: the compaction changes the forwarded start once
    (an event); the turns after it reuse the summary byte for byte, their new messages added at
    the end."""
    proxy, statuses = await compacting_session(driver, fake, make_proxy, credential(driver))
    assert statuses[0] == "none" and {"summarized", "reused"} <= set(statuses), statuses
    assert await breaks(proxy, driver) == 0


async def test_a_compacted_request_fingerprints_its_head_and_new_turn_only(driver, fake, make_proxy, monkeypatch):
    """A compacted request's fingerprints are the previous request's for the envelopes it forwards
    again at the same places (its kept history): it looks up its head and its new turn only (each
    looked every forwarded envelope up among the client's before)."""
    from proxy.ops import prefix_alarm

    calls: list[tuple[int, int]] = []  # of requests whose previous one fingerprinted: (forwarded, looked up)
    real = prefix_alarm.per_item

    def counted(request, name, items, fn):
        looked: list[int] = []
        before = request.owner.before(name)
        done = real(request, name, items, lambda e: (looked.append(1), fn(e))[1])
        assert done == [fn(e) for e in items]  # what looking every one up gives
        if before is not None:
            calls.append((len(items), len(looked)))
        return done

    monkeypatch.setattr(prefix_alarm, "per_item", counted)
    await compacting_session(driver, fake, make_proxy, credential(driver))
    # the head (system, summary) and the turn; a new summary moves the cut: that request reads all
    assert len([k for n, k in calls if k <= 4 < n]) >= max(3, len(calls) - 1), calls


def test_first_difference():
    assert first_difference([1, 2], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3, 4]) == 1
    assert first_difference([1, 2, 3], [1, 2]) == 2  # shorter, though what is left agrees


async def test_messages_moving_cache_breakpoints_are_no_break(make_proxy):
    """Claude Code marks its newest message with cache_control and unmarks it on the next turn:
    the marker is not content (the provider's cache reads past it), so that is no break."""
    driver = MESSAGES
    async with driver.make_fake() as fake:
        proxy = await make_proxy(fake.base_url, driver.settings(fake, 200_000))
        messages = chat_history(6, 40)
        for i in range(4):
            messages = grown(messages, i)
            body = driver.body(messages)
            body["messages"][-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
            answer = await post(proxy, json.dumps(body).encode(), {**credential(driver), "anthropic-version": "2023-06-01",
                                                                   "Content-Type": "application/json"},
                                path="/messages", expect=200)
            assert answer.headers["x-compaction-status"] == "none"
        assert await breaks(proxy, driver) == 0


async def test_messages_under_the_line_makes_no_digest_the_alarm_does_not_compare(make_proxy, monkeypatch):
    """A growing Messages conversation whose bodies reuse the previous parse: the alarm answers
    from the shared count and makes none of the new messages' stable digests (nothing else asks
    for them under the prepare line); a rewritten history still breaks, its digests made then."""
    from proxy.protocols.messages.adapter import UNMARKED

    made = []
    digest = UNMARKED._digest
    monkeypatch.setattr(UNMARKED, "_digest", lambda msg: made.append(msg) or digest(msg))
    driver = MESSAGES
    async with driver.make_fake() as fake:
        proxy = await make_proxy(fake.base_url, driver.settings(fake, 200_000))
        messages = chat_history(6, 600)
        per_request = []
        for i in range(4):
            messages = grown(messages, i)
            before = len(made)
            answer = await driver.send_raw(proxy, messages, credential(driver))
            assert answer.headers["x-compaction-status"] == "none"
            per_request.append(len(made) - before)
        assert per_request[1:] == [0, 0, 0], per_request
        rewritten = copy.deepcopy(grown(messages, 9))
        rewritten[3]["content"] += " (edited later by the client)"
        await driver.send_raw(proxy, rewritten, credential(driver))
        assert await breaks(proxy, driver) == 1
