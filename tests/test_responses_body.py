"""Checking a Responses request body (issue 14 item 1): only what the proxy reads, each mistake a
400 in OpenAI's shape naming the field; unknown top-level fields pass."""

from __future__ import annotations

import orjson
import pytest

from proxy.errors import ProxyError
from proxy.protocols.responses.body import parse_responses_body
from proxy.protocols.responses.adapter import ResponsesAdapter
from proxy.protocols.responses.stream import responses_usage


def body(**over) -> bytes:
    return orjson.dumps({"model": "gpt-5", "input": "hi", **over})


def test_a_good_body_and_unknown_fields_pass() -> None:
    parsed = parse_responses_body(body(some_future_field={"x": 1}, input=[{"role": "user", "content": "hi"}]))
    assert parsed["some_future_field"] == {"x": 1}


@pytest.mark.parametrize("raw, param, code", [
    (b"", None, "empty_body"),
    (b"[1]", None, "invalid_type"),
    (orjson.dumps({"input": "hi"}), "model", "missing_required_parameter"),
    (body(model=3), "model", "invalid_type"),
    (body(input=5), "input", "invalid_type"),
    (body(instructions=["x"]), "instructions", "invalid_type"),
    (body(tools={}), "tools", "invalid_type"),
    (body(stream="yes"), "stream", "invalid_type"),
    (body(input=["text"]), "input[0]", "invalid_type"),
    (body(input=[{"content": "no type, no role"}]), "input[0].type", "missing_required_parameter"),
    (b'{"model": "a", "model": "b", "input": "x"}', None, "duplicate_keys"),
])
def test_mistakes_are_named(raw: bytes, param, code) -> None:
    with pytest.raises(ProxyError) as e:
        parse_responses_body(raw)
    assert e.value.status == 400 and e.value.param == param and e.value.code == code


def test_usage_of_an_answer() -> None:
    u = {"input_tokens": 120, "input_tokens_details": {"cached_tokens": 100}, "output_tokens": 9}
    assert responses_usage(u).prompt == 120 and responses_usage(u).cached == 100 and responses_usage(u).completion == 9
    adapter = ResponsesAdapter()
    assert adapter.usage(orjson.dumps({"usage": u})).cached == 100
    assert adapter.answer_usage({"usage": u}).cached == 100  # the answer the relay's check parsed
    assert responses_usage({"prompt_tokens": 1}) is None and adapter.usage(b"not json") is None
    assert adapter.usage(b"[1]") is None
