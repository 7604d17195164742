"""Token counting (design.md § Counting tokens): encoding per model family, chat-format overhead, tools, images,
the per-message cache and the offline estimate."""

from __future__ import annotations

import logging

import pytest
import tiktoken

from support.compaction_helpers import analyze
from proxy.hashing import message_digest
from proxy.tokens import IMAGE_TOKENS, MESSAGE_OVERHEAD, REPLY_OVERHEAD, TokenCounter, encoding_name_for


@pytest.mark.parametrize("model", [
    "gpt-4o", "gpt-4o-mini", "gpt-4o-2024-08-06", "chatgpt-4o-latest", "gpt-4.1", "gpt-4.1-nano", "gpt-5",
    "gpt-5-mini", "o1", "o1-mini", "o3", "o3-mini", "o4-mini", "o5", "openai/gpt-4o", "ft:gpt-4o-mini:acme::abc123",
    "GPT-4O",
])
def test_o200k_models(model):
    assert encoding_name_for(model) == "o200k_base"


@pytest.mark.parametrize("model", [
    "gpt-4", "gpt-4-turbo", "gpt-4-0613", "gpt-3.5-turbo", "ft:gpt-3.5-turbo:acme::x", "llama-3.1-70b",
    "claude-3-5-sonnet", "qwen2.5-coder", "mistral/mixtral-8x7b", "omni-moderation", "default",
])
def test_cl100k_for_other_models(model):
    assert encoding_name_for(model) == "cl100k_base"


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    c = TokenCounter()
    assert c.load()
    return c


def _msg_tokens(counter: TokenCounter, msg: dict, enc: str = "cl100k_base") -> int:
    return counter.count_message(msg, enc, message_digest(msg))


def test_chat_overhead_per_message_and_reply(counter):
    enc = tiktoken.get_encoding("o200k_base")
    text = "The quick brown fox jumps over the lazy dog."
    msg = {"role": "user", "content": text}
    expected = MESSAGE_OVERHEAD + len(enc.encode("user")) + len(enc.encode(text))
    assert _msg_tokens(counter, msg, "o200k_base") == expected
    conv = analyze({"model": "gpt-4o", "messages": [msg, msg]}, counter, ratio=1.0)
    assert conv.total() == 2 * expected + REPLY_OVERHEAD
    # The same text counts differently under cl100k: the model picks the encoding.
    cl = len(tiktoken.get_encoding("cl100k_base").encode(text))
    assert analyze({"model": "gpt-4", "messages": [msg]}, counter, ratio=1.0).conversation.tokens == [
        MESSAGE_OVERHEAD + 1 + cl
    ]


def test_name_and_tool_calls_counted(counter):
    plain = {"role": "assistant", "content": "ok"}
    named = {**plain, "name": "helper"}
    calls = {**plain, "tool_calls": [{"id": "call_1", "type": "function",
                                      "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    base = _msg_tokens(counter, plain)
    assert _msg_tokens(counter, named) > base
    assert _msg_tokens(counter, calls) >= base + 3 + 5
    tool = {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    assert _msg_tokens(counter, tool) > _msg_tokens(counter, {"role": "tool", "content": "sunny"})


def test_tools_are_counted(counter):
    tools = [{"type": "function", "function": {"name": "search", "description": "Search the web for a query.",
                                               "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]
    msgs = [{"role": "user", "content": "hi"}]
    without = analyze({"model": "gpt-4o", "messages": msgs}, counter, ratio=1.0)
    with_tools = analyze({"model": "gpt-4o", "messages": msgs, "tools": tools}, counter, ratio=1.0)
    assert with_tools.tools_tokens > 10
    assert with_tools.total() == without.total() + with_tools.tools_tokens


def test_images_count_a_fixed_estimate(counter):
    def image(url: str) -> dict:
        return {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": url}}]}

    small = _msg_tokens(counter, image("data:image/png;base64," + "A" * 10))
    huge = _msg_tokens(counter, image("data:image/png;base64," + "A" * 500_000))
    text_only = _msg_tokens(counter, {"role": "user", "content": [{"type": "text", "text": "look"}]})
    assert small == huge == text_only + IMAGE_TOKENS  # the base64 payload is never tokenized


def test_token_ratio_scales_the_total(counter):
    body = {"model": "my-llama", "messages": [{"role": "user", "content": "word " * 100}]}
    plain = analyze(body, counter, ratio=1.0).total()
    assert analyze(body, counter, ratio=1.5).total() == int(plain * 1.5)


class CountingEncoding:
    """Wraps a tiktoken encoding and counts calls to it."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls = 0

    def encode_ordinary(self, text: str) -> list[int]:
        self.calls += 1
        return self.inner.encode_ordinary(text)


def test_long_history_is_not_reencoded():
    c = TokenCounter()
    spy = CountingEncoding(tiktoken.get_encoding("o200k_base"))
    c._encodings["o200k_base"] = spy
    history = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " + "lorem ipsum " * 200}
               for i in range(200)]
    first = analyze({"model": "gpt-4o", "messages": history}, c, ratio=1.0)
    calls_first = spy.calls
    assert calls_first >= 200
    # Next turn: same history (fresh dict objects, as after parsing a new request) plus two messages.
    grown = [dict(m) for m in history] + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}]
    second = analyze({"model": "gpt-4o", "messages": grown}, c, ratio=1.0)
    assert second.conversation.tokens[:200] == first.conversation.tokens
    assert spy.calls - calls_first <= 2 * 2  # role + content of the two new messages only
    assert len(c._cache) == 202  # one entry per distinct message


def test_cache_is_bounded():
    c = TokenCounter(cache_size=10)
    assert c.load(["cl100k_base"])
    for i in range(50):
        m = {"role": "user", "content": f"m{i}"}
        c.count_message(m, "cl100k_base", message_digest(m))
    assert len(c._cache) == 10


def test_estimate_when_no_encoding_loads(monkeypatch, caplog):
    def fail(name):
        raise OSError("offline")

    monkeypatch.setattr(tiktoken, "get_encoding", fail)
    c = TokenCounter()
    with caplog.at_level(logging.WARNING, logger="proxy.tokens"):
        assert c.load() is False
    assert c.estimating
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "estimated" in warnings[0].getMessage()
    assert c.count_text("x" * 400, "o200k_base") == 100  # bytes/4
    assert c.count_text("é" * 10, "cl100k_base") == 5  # 20 UTF-8 bytes
    conv = analyze({"model": "gpt-4o", "messages": [{"role": "user", "content": "a" * 40}]}, c, ratio=1.0)
    assert conv.total() > 10
    # Counting on the hot path neither retries the load nor warns again.
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1


def test_missing_family_falls_back_to_loaded_encoding_consistently(monkeypatch):
    real = tiktoken.get_encoding
    cl100k = real("cl100k_base")

    def only_cl100k(name):
        if name != "cl100k_base":
            raise OSError("offline")
        return real(name)

    monkeypatch.setattr(tiktoken, "get_encoding", only_cl100k)
    c = TokenCounter()
    assert c.load()
    text = "Übermäßig lange Sätze " * 20
    expected = len(cl100k.encode_ordinary(text))
    assert expected != (len(text.encode()) + 3) // 4
    # Every count (not just the first) uses the loaded family rather than bytes/4.
    assert [c.count_text(text, "o200k_base") for _ in range(3)] == [expected] * 3
