"""The fake upstream's opt-in llama.cpp behaviours, seen on the real server by the e2e suite
(docs/e2e-llama-server-notes.md): off by default, exactly the real server's answer when on."""

from __future__ import annotations

import json

import openai
import pytest

from proxy.fakes.chat import FakeUpstream
from support.client import openai_client, post

MODEL = "gpt-4o-mini"
CALL = {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}


def _with_call(content: str | None) -> list[dict]:
    return [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": content, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
    ]


async def test_null_content_with_tool_calls_is_a_500_only_when_asked():
    async with FakeUpstream() as fake:
        body = {"model": MODEL, "messages": _with_call(None)}
        assert (await post(fake, body)).status == 200  # OpenAI accepts it
        fake.reject_null_content_with_tool_calls = True
        status, _, data = await post(fake, body)
        error = json.loads(data)["error"]
        assert status == 500 and error["type"] == "internal_server_error"
        assert "('body', 'messages', 1, 'content')" in error["message"]
        assert (await post(fake, {"model": MODEL, "messages": _with_call("")})).status == 200


async def test_streaming_overflow_is_an_empty_200_stream_only_when_asked():
    long = {"model": MODEL, "messages": [{"role": "user", "content": "word " * 300}], "stream": True}
    async with FakeUpstream(window=100) as fake:
        status, _, data = await post(fake, long)
        assert status == 400 and json.loads(data)["error"]["code"] == "context_length_exceeded"

        fake.empty_stream_on_overflow = True
        status, headers, data = await post(fake, long)
        assert (status, data) == (200, b"") and headers["Content-Type"].startswith("text/event-stream")
        # The SDK yields no chunk and raises nothing, as with the real server.
        async with openai_client(fake, "sk-test") as client:
            stream = await client.chat.completions.create(model=MODEL, messages=long["messages"], stream=True)
            assert [chunk async for chunk in stream] == []
            # Non-streaming requests still get the 400.
            with pytest.raises(openai.BadRequestError) as ei:
                await client.chat.completions.create(model=MODEL, messages=long["messages"])
            assert ei.value.code == "context_length_exceeded"
