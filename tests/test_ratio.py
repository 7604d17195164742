"""Counting honestly (issue 12 item 7): per-model token ratios learned from the upstream's usage."""

from __future__ import annotations

import pytest

from proxy.ratio import HIGH, LOW, MIN_TOKENS, update_ratio
from support.client import chat, openai_client
from support.compaction_helpers import chat_history

MODEL = "gpt-4"


def test_update_is_smoothed_and_bounded():
    assert update_ratio(None, 1000, 1300) == pytest.approx(1.3)
    assert 1.0 < update_ratio(1.0, 1000, 1300) < 1.3  # one answer moves it part of the way
    assert update_ratio(2.5 - 0.5, 1000, 2000) == HIGH and update_ratio(None, 1000, 500) == LOW
    # a usage no tokenizer explains (a fixed figure, another request's) is ignored, not clamped
    assert update_ratio(1.1, 1000, 10**6) == 1.1 and update_ratio(None, 50_000, 100) is None
    assert update_ratio(1.2, MIN_TOKENS - 1, 5000) == 1.2  # too small to say anything
    assert update_ratio(None, 1000, 0) is None
    r = None
    for _ in range(30):
        r = update_ratio(r, 4000, 5200)
    assert r == pytest.approx(1.3)


def growing(turns: int):
    """The requests of a plain chat growing one turn at a time."""
    full = chat_history(turns, 120)
    return [full[: 2 * k + 1] for k in range(1, turns + 1)]


async def replay(proxy, points):
    statuses = []
    async with openai_client(proxy, "sk-ratio") as client:
        for history in points:
            statuses.append((await chat(client, history, model=MODEL)).status)
    return statuses


@pytest.mark.parametrize("learn", [True, False])
async def test_an_upstream_counting_more_is_compacted_before_its_window(upstream, make_proxy, learn):
    upstream.window = 6000
    upstream.token_scale = 1.3  # its tokenizer counts 30% more than tiktoken
    proxy = await make_proxy(upstream.base_url, {"models": {MODEL: {"context_window": 6000}},
                                                 "compaction": {"prepare_percent": 0, "learn_token_ratio": learn}})
    statuses = await replay(proxy, growing(24))
    rejected = [r.prompt_tokens for r in upstream.records("chat") if r.status != 200]
    if learn:
        assert rejected == []  # compacted before the upstream's window, never an overflow
        assert "summarized" in statuses
        assert await proxy.state.ratios.ratio(MODEL, default=1.0) == pytest.approx(1.3, abs=0.02)
    else:  # what the learning prevents: requests over the real window (then the overflow retry)
        assert rejected and all(n > 6000 for n in rejected)


async def test_the_learned_ratio_is_kept_in_the_store(upstream, make_proxy, tmp_path):
    upstream.token_scale = 1.3
    settings = {"store": {"url": f"sqlite:///{tmp_path}/ratio.db"}, "compaction": {"prepare_percent": 0, "learn_token_ratio": True}}
    first = await make_proxy(upstream.base_url, settings)
    await replay(first, growing(3))
    await first.state.ratios.idle()
    await first.close()
    again = await make_proxy(upstream.base_url, settings)
    assert await again.state.ratios.ratio(MODEL, 1.0) == pytest.approx(1.3, abs=0.05)
    assert await again.state.ratios.ratio("another-model", 1.1) == 1.1  # per model; the configured value until learned
