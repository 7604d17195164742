"""The proxy's own summarizer calls: output-cap parameter choice and fallback, error mapping."""

from __future__ import annotations

import aiohttp
import pytest

from proxy.upstream import SummarizerError, UpstreamCaller, is_context_overflow


async def _call(caller, model="gpt-4"):
    return await caller.complete(
        headers={"Authorization": "Bearer sk-x"}, model=model,
        messages=[{"role": "user", "content": "hello"}], max_output_tokens=50, timeout_s=5,
    )


def _caps(upstream):
    return [tuple(k for k in ("max_tokens", "max_completion_tokens") if k in r.json) for r in upstream.requests]


async def test_compatible_servers_get_max_tokens_and_openai_gets_max_completion_tokens(upstream):
    async with aiohttp.ClientSession() as s:
        assert await _call(UpstreamCaller(s, upstream.base_url, 5))
        assert _caps(upstream) == [("max_tokens",)]
        openai_like = UpstreamCaller(s, "https://api.openai.com/v1", 5)
        assert openai_like._default_param == "max_completion_tokens"


@pytest.mark.parametrize("rejected, used", [("max_tokens", "max_completion_tokens")])
async def test_rejected_cap_parameter_falls_back_and_is_remembered(upstream, rejected, used):
    upstream.reject_param = rejected
    async with aiohttp.ClientSession() as s:
        caller = UpstreamCaller(s, upstream.base_url, 5)
        assert await _call(caller)
        assert await _call(caller)
    # first call: rejected then retried with the other; second call: straight to the one that worked
    assert _caps(upstream) == [(rejected,), (used,), (used,)]


async def test_overflow_and_http_errors_are_told_apart(upstream):
    upstream.window = 5
    async with aiohttp.ClientSession() as s:
        caller = UpstreamCaller(s, upstream.base_url, 5)
        with pytest.raises(SummarizerError) as e:
            await _call(caller)
        assert e.value.kind == "overflow"
        upstream.window = 128000
        upstream.fail_status = 500
        with pytest.raises(SummarizerError) as e:
            await _call(caller)
        assert e.value.kind == "http"


async def test_unreachable_upstream_is_a_network_error():
    async with aiohttp.ClientSession() as s:
        with pytest.raises(SummarizerError) as e:
            await _call(UpstreamCaller(s, "http://127.0.0.1:9/v1", 2))
    assert e.value.kind == "network"


def test_overflow_detection_shapes():
    assert is_context_overflow(400, b'{"error": {"code": "context_length_exceeded", "message": "x"}}')
    assert is_context_overflow(400, b'{"error": {"message": "This model\'s maximum context length is 4096 tokens"}}')
    assert is_context_overflow(413, b"prompt is too long")
    assert not is_context_overflow(400, b'{"error": {"message": "Invalid value for temperature"}}')
    assert not is_context_overflow(500, b'{"error": {"code": "context_length_exceeded"}}')
