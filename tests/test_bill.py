"""The bill (design.md § The operator's view, proxy/ops/bill.py): direct and proxied costs on a replay against the fake
upstream's prefix cache, checked against a computation by hand from the recorded usage."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.compaction_helpers import analyze
from proxy.ops.bill import Bill, Figures, cacheable, shared_prefix_tokens
from proxy.exchange import Exchange, Prefix, Usage
from proxy.ops.prices import Price, PriceTable
from support.client import chat, get, openai_client
from support.compaction_helpers import counter
from support.ops_replay import MODEL, SETTINGS, conversation, replay, request_points
from support.proxy_server import merge

PRICE = {"input": 30.0, "cached_input": 15.0, "output": 60.0}  # gpt-4's has no built-in entry
P = Price(30.0, 15.0, 60.0)


def billed(settings: dict[str, Any]) -> dict[str, Any]:
    return merge(settings, {"billing": {"prices": {MODEL: PRICE}}})


async def bill_of(proxy: Any) -> dict[str, Any]:
    answer = await get(proxy.root, "/admin/api/bill")
    assert answer.status == 200
    return answer.json()


def original_tokens(messages: list[dict[str, Any]]) -> list[int]:
    """The proxy's count of each message the client sent (its own counting function)."""
    return analyze({"model": MODEL, "messages": messages}, counter(), ratio=1.0).conversation.tokens


def by_hand(points: list[list[dict[str, Any]]], answers: list[Any], upstream: Any) -> tuple[float, float]:
    """(direct, proxied) dollars, from the fake's records and the answers' headers and usage."""
    proxied = sum(P.cost(r.prompt_tokens, r.cached_tokens, r.completion_tokens)
                  for r in upstream.records() if r.kind in ("chat", "summarizer") and r.status == 200)
    direct = 0.0
    previous: list[dict[str, Any]] = []
    for messages, a in zip(points, answers):
        common = 0
        while common < min(len(previous), len(messages)) and previous[common] == messages[common]:
            common += 1
        shared = sum(original_tokens(messages)[:common])  # no tools in this replay
        prompt = a.usage["prompt_tokens"] + int(a.headers["x-compaction-tokens-before"]) - int(
            a.headers["x-compaction-tokens-after"])
        cached = min(prompt, shared)
        cached = 0 if cached < 1024 else cached - (cached - 1024) % 128  # OpenAI's cache steps
        direct += P.cost(prompt, cached, a.usage["completion_tokens"])
        previous = messages
    return direct, proxied


async def test_direct_and_proxied_costs_match_a_hand_computation(upstream, make_proxy):
    proxy = await make_proxy(upstream.base_url, billed(SETTINGS))
    points = request_points(conversation("bill"))
    answers = await replay(proxy.base_url, points)
    assert {"summarized", "reused"} <= {a.headers["x-compaction-status"] for a in answers}
    assert len(upstream.summarizer_requests) >= 2  # a tool note and a history summary, both billed
    bill = await bill_of(proxy)
    direct, proxied = by_hand(points, answers, upstream)
    total = bill["total"]
    assert total["requests"] == len(answers) and total["unbilled"] == 0 and total["unpriced"] == 0
    assert total["summarizer_calls"] == len(upstream.summarizer_requests)
    assert total["direct"] == pytest.approx(direct, rel=1e-9)
    assert total["proxy"] == pytest.approx(proxied, rel=1e-9)
    assert total["saved"] == pytest.approx(direct - proxied, rel=1e-9)
    assert total["proxy_cached"] == sum(a.usage["prompt_tokens_details"]["cached_tokens"] for a in answers) > 0
    # One conversation: its figures are the total; the journal's event carries them as they were.
    (conv,) = bill["conversations"]
    assert conv["direct"] == pytest.approx(direct) and conv["proxy"] == pytest.approx(proxied)
    assert bill["prices_date"]


async def test_without_compaction_direct_and_proxied_are_the_same(upstream, make_proxy):
    """Forwarded untouched, every request is the direct request: the estimate of the direct cache
    (the prefix shared with the previous request) must then be what the provider cached, up to the
    difference between the proxy's token count and the provider's (a few tokens a message)."""
    proxy = await make_proxy(upstream.base_url, billed(merge(SETTINGS, {
        "compaction": {"enabled": False}, "tool_results": {"enabled": False}})))
    points = request_points(conversation("plain"))[:8]
    answers = await replay(proxy.base_url, points)
    total = (await bill_of(proxy))["total"]
    assert total["proxy_cached"] > 0
    assert total["direct_cached"] == pytest.approx(total["proxy_cached"], rel=0.005)
    assert total["direct_prompt"] == total["proxy_prompt"]
    assert total["direct"] == pytest.approx(total["proxy"], rel=0.005)
    assert total["direct"] == pytest.approx(by_hand(points, answers, upstream)[0])


async def test_streams_without_usage_are_counted_not_billed(upstream, make_proxy):
    proxy = await make_proxy(upstream.base_url, billed(SETTINGS))

    async with openai_client(proxy, "sk-x") as c:
        async for _ in await c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                       stream=True):
            pass
    total = (await bill_of(proxy))["total"]
    assert (total["requests"], total["unbilled"], total["direct"]) == (0, 1, 0)


def test_prices_are_found_by_the_longest_matching_name():
    table = PriceTable({"my-llama": type("P", (), {"input": 1.0, "cached_input": None, "output": 2.0})()})
    assert table.find("gpt-4o-mini-2024-07-18") == table.prices["gpt-4o-mini"]
    assert table.find("gpt-4o-2024-08-06") == table.prices["gpt-4o"]
    assert table.find("o3-mini") == table.prices["o3-mini"]
    assert table.find("claude-opus-5-5-20261001") == Price(4.0, 0.40, 20.0)  # not Opus 5's
    assert table.find("claude-sonnet-5-5") == table.find("claude-sonnet-5") == Price(2.0, 0.20, 10.0)
    assert table.find("my-llama") == Price(1.0, 1.0, 2.0)  # no cached rate: the input rate
    assert table.find("gpt-4") is None and table.find("unknown") is None
    assert Price(2.0, 0.5, 8.0).cost(prompt=1_000_000, cached=400_000, completion=10_000) == pytest.approx(
        0.6 * 2.0 + 0.4 * 0.5 + 0.01 * 8.0)


async def test_bypassed_requests_are_billed_as_sent(upstream, make_proxy):
    proxy = await make_proxy(upstream.base_url, billed(SETTINGS))

    points = request_points(conversation("bypass"))[:6]
    async with openai_client(proxy, "sk-b") as c:
        for messages in points:
            assert (await chat(c, messages, {"x-compaction-bypass": "1"}, model=MODEL)).status == "bypassed"
    total = (await bill_of(proxy))["total"]
    assert total["requests"] == len(points) and total["summarizer_calls"] == 0
    assert total["direct_prompt"] == total["proxy_prompt"]
    assert total["direct"] == pytest.approx(total["proxy"], rel=0.005)


def _reference_request(bill: Bill, ex: Exchange, figures: dict[str, Figures], last: dict[str, Any]) -> None:
    """The bill's request figures as first written (the shared prefix always looked for, Price.cost
    called for each figure): what the cheaper request_done must keep adding up."""
    c = figures.setdefault(ex.conversation, Figures())
    prev, prev_model = last.get(ex.conversation, (None, ""))
    shared = shared_prefix_tokens(prev, prev_model, ex.prefix, ex.model)
    last[ex.conversation] = (ex.prefix, ex.model)
    u = ex.usage
    if u is None or ex.code != 200:
        c.unbilled += 1
        return
    removed = ex.tokens_before - (ex.tokens_after if ex.tokens_after is not None else ex.tokens_before)
    direct_prompt = max(0, u.prompt + removed)
    direct_cached = cacheable(min(direct_prompt, shared))
    price = bill.prices.find(ex.model)
    c.requests += 1
    c.direct_prompt += direct_prompt
    c.direct_cached += direct_cached
    c.proxy_prompt += u.prompt
    c.proxy_cached += u.cached
    c.completion += u.completion
    if price is None:
        c.unpriced += 1
    else:
        c.direct += price.cost(direct_prompt, direct_cached, u.completion)
        c.proxy += price.cost(u.prompt, u.cached, u.completion)


_tokens = st.lists(st.integers(0, 900), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(requests=st.lists(st.tuples(
    st.sampled_from(["a", "b"]), st.sampled_from(["gpt-4o", "gpt-4o-mini", "no-price-model"]),
    st.lists(st.integers(0, 3), min_size=1, max_size=6), _tokens, st.sampled_from([0, 700]),
    st.integers(0, 6000), st.none() | st.integers(0, 6000), st.none() | st.tuples(st.integers(0, 6000), st.integers(0, 1)),
    st.sampled_from([200, 200, 429])), max_size=12))
def test_a_requests_figures_are_the_same_as_the_plain_computations(requests):
    """request_done skips the shared-prefix look-up for a prompt under the cache's minimum and
    writes the costs out; every figure must stay what the plain computation gives, to the bit."""
    bill = Bill(PriceTable())
    figures: dict[str, Figures] = {}
    last: dict[str, Any] = {}
    for conv, model, keys, tokens, tools, before, after, usage, code in requests:
        ex = Exchange("r", "POST", "/v1/chat/completions", "/v1/chat/completions", "chat_completions")
        n = min(len(keys), len(tokens))
        ex.code, ex.model, ex.conversation = code, model, conv
        ex.prefix = Prefix(keys[:n], tokens[:n], tools)
        ex.tokens_before, ex.tokens_after = before, after
        if usage is not None:
            prompt = usage[0]
            ex.usage = Usage(prompt, prompt // 2 if usage[1] else 0, 17)
        bill.request_done(ex)
        _reference_request(bill, ex, figures, last)
    for conv, expected in figures.items():
        got = bill.conversation(conv)
        assert got is not None
        assert {k: got[k] for k in expected.as_dict()} == expected.as_dict()
