"""A message whose count is known is looked up, not counted through `TokenCounter.count_message`
(the counting closure made, the cache's order moved, two calls more: every message of every
small request paid it), for Messages and Gemini as for chat; the counts are the same."""

from __future__ import annotations

import pytest

from bench.workloads import small_protocol_body
from proxy.config import Config
from proxy.protocols.registry import PROTOCOLS
from proxy.tokens import TokenCounter


@pytest.mark.parametrize("protocol", ["chat", "messages", "gemini"])
def test_a_message_counted_before_is_taken_from_the_cache(protocol, monkeypatch):
    adapter, counter, cfg = PROTOCOLS[protocol].adapter, TokenCounter(), Config()
    raw = small_protocol_body(protocol, "gpt-4o")
    kw = {"model": "gpt-4o"} if protocol == "gemini" else {}
    calls: list[object] = []
    real = TokenCounter.count_message
    monkeypatch.setattr(TokenCounter, "count_message", lambda self, *a, **k: calls.append(a) or real(self, *a, **k))
    first = adapter.parse(raw, counter, cfg, **kw)
    assert calls  # counted once
    calls.clear()
    again = adapter.parse(raw, counter, cfg, **kw)
    assert calls == [] and again.conversation.tokens == first.conversation.tokens
