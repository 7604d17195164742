"""The Messages adapter's pure parts (issue 15): windows, overflow recognition, the SSE checker."""

from __future__ import annotations

import json

import pytest
from multidict import CIMultiDict

from proxy.adapters.messages.overflow import is_prompt_too_long
from proxy.adapters.messages.stream import MessagesEventChecker, messages_usage
from proxy.adapters.messages.windows import long_context, request_window
from proxy.config import Config


# ---- windows -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("model", "beta", "window"), [
    ("claude-sonnet-4-6", None, 200_000),
    ("claude-sonnet-4-6", "context-1m-2025-08-07", 1_000_000),
    ("claude-sonnet-4-5-20250929", "interleaved-thinking-2025-05-14, context-1m-2025-08-07", 1_000_000),
    ("claude-opus-4-6", "context-1m-2025-08-07", 1_000_000),
    ("claude-opus-4-5", "context-1m-2025-08-07", 200_000),  # no 1M variant: the beta changes nothing
    ("claude-haiku-4-5", "context-1m-2025-08-07", 200_000),
    ("claude-3-5-haiku-20241022", None, 200_000),
    ("anthropic/claude-sonnet-4", "context-1m-2025-08-07", 1_000_000),
    ("claude-sonnet-4-6", "interleaved-thinking-2025-05-14", 200_000),
])
def test_claude_windows_and_the_1m_beta(model, beta, window):
    headers = CIMultiDict({"anthropic-beta": beta} if beta else {})
    assert request_window(Config(), model, headers) == window


def test_the_beta_may_come_in_a_repeated_header():
    headers = CIMultiDict([("anthropic-beta", "a-2025"), ("anthropic-beta", "context-1m-2025-08-07")])
    assert long_context(headers) and not long_context(CIMultiDict())


def test_models_config_overrides_the_claude_windows():
    cfg = Config.model_validate({"models": {"claude-sonnet-4-6": {"context_window": 50_000}}})
    assert request_window(cfg, "claude-sonnet-4-6", CIMultiDict({"anthropic-beta": "context-1m-2025-08-07"})) == 50_000
    assert request_window(cfg, "claude-opus-4-6", CIMultiDict()) == 200_000


# ---- overflow ----------------------------------------------------------------------------------

def err(message: str, type_: str = "invalid_request_error") -> bytes:
    return json.dumps({"type": "error", "error": {"type": type_, "message": message}}).encode()


@pytest.mark.parametrize(("status", "body", "overflow"), [
    (400, err("prompt is too long: 210000 tokens > 200000 maximum"), True),
    (400, err("input length and `max_tokens` exceed context limit: 198000 + 21333 > 200000, decrease input "
              "length or `max_tokens` and try again"), True),
    (400, err("messages.0.content: Field required"), False),
    (400, err('messages: roles must alternate between "user" and "assistant"'), False),
    (429, err("Number of request tokens has exceeded your per-minute rate limit", "rate_limit_error"), False),
    (529, err("Overloaded", "overloaded_error"), False),
    (400, b'{"error": {"message": "This model\'s maximum context length is 8192 tokens", "code": '
          b'"context_length_exceeded"}}', True),  # a compatible server answering in OpenAI's words
    (400, b"not json at all", False),
])
def test_prompt_too_long_is_recognized(status, body, overflow):
    assert is_prompt_too_long(status, body) is overflow


# ---- the SSE checker ---------------------------------------------------------------------------

def ev(data: dict, name: str | None = None) -> bytes:
    return f"event: {name or data['type']}\ndata: {json.dumps(data)}\n\n".encode()


START = {"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant", "content": [],
                                               "model": "c", "usage": {"input_tokens": 10, "output_tokens": 1,
                                                                       "cache_read_input_tokens": 90,
                                                                       "cache_creation_input_tokens": 5}}}
BLOCK = [{"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
         {"type": "ping"},
         {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
         {"type": "content_block_stop", "index": 0}]
END = [{"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 7}},
       {"type": "message_stop"}]


def run(stream: bytes, piece: int = 7) -> tuple[bytes, str | None, MessagesEventChecker]:
    c = MessagesEventChecker()
    out = b""
    for i in range(0, len(stream), piece):
        good, why = c.feed(stream[i:i + piece])
        out += good
        if why:
            return out, why, c
    rest, why = c.finish()
    return out + rest, why, c


def test_a_whole_stream_passes_byte_for_byte_with_its_usage():
    stream = b"".join(ev(e) for e in [START, *BLOCK, *END])
    out, why, c = run(stream)
    assert why is None and out == stream and c.done
    assert messages_usage(c.usage) is not None
    u = messages_usage(c.usage)
    assert (u.prompt, u.cached, u.completion) == (105, 90, 7)


@pytest.mark.parametrize(("events", "says"), [
    ([START, *BLOCK], "before message_stop"),
    ([*BLOCK, *END], "before message_start"),
    ([START, *END, {"type": "content_block_stop", "index": 0}], "after the end"),
])
def test_streams_out_of_order_or_unfinished_are_broken(events, says):
    _, why, _ = run(b"".join(ev(e) for e in events))
    assert why is not None and says in why


def test_bad_json_and_mismatched_names_are_broken():
    _, why, _ = run(ev(START) + b"event: content_block_delta\ndata: {\"type\": \n\n")
    assert "not valid JSON" in why
    _, why, _ = run(ev(START) + ev({"type": "message_stop"}, name="ping"))
    assert "named 'ping'" in why


def test_an_error_event_is_an_end_and_unknown_events_pass():
    out, why, c = run(ev(START) + ev({"type": "future_event", "x": 1}) +
                      ev({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}))
    assert why is None and c.done and out.endswith(b"Overloaded\"}}\n\n")
