"""The proxy's own Messages calls (proxy/adapters/messages/caller.py) against the strict fake:
what a summarizer or tool-note call sends and how its answers are read."""

from __future__ import annotations

import aiohttp
import pytest

from proxy.adapters.messages.caller import MessagesCaller, to_messages_body
from proxy.fakes.common import FakeError
from proxy.fakes.messages import FakeMessages
from proxy.prompts import Prompts
from proxy.upstream import SummarizerError

MODEL = "claude-sonnet-4-6"


@pytest.fixture
async def fake():
    async with FakeMessages() as f:
        yield f


async def call(fake, messages, **kw):
    async with aiohttp.ClientSession() as s:
        caller = MessagesCaller(s, fake.origin, 5)
        usage: dict = {}
        text = await caller.complete(headers={"x-api-key": "sk-ant-c", "anthropic-version": "2023-06-01"},
                                     model=MODEL, messages=messages, max_output_tokens=300, timeout_s=10,
                                     usage=usage, **kw)
        return text, usage


async def test_a_summary_call_is_a_messages_call_with_the_clients_key(fake):
    system = Prompts().text("summarization-system")
    text, usage = await call(fake, [{"role": "system", "content": system},
                                    {"role": "user", "content": "<conversation>\n[User]: hi\n</conversation>"}])
    assert "## " in text
    got = fake.records("summarizer")[-1]
    assert got.json["system"] == system and got.json["max_tokens"] == 300 and got.json["stream"] is False
    assert got.headers["x-api-key"] == "sk-ant-c" and got.headers["anthropic-version"] == "2023-06-01"
    assert usage["prompt_tokens"] == got.prompt_tokens and usage["completion_tokens"] > 0


def test_a_user_message_after_a_user_prefix_is_merged_and_tool_choice_translated():
    prefix = [{"role": "user", "content": [{"type": "text", "text": "q", "cache_control": {"type": "ephemeral"}}]}]
    body = to_messages_body(MODEL, [*prefix, {"role": "user", "content": "Summarize."}], 100,
                            {"system": [{"type": "text", "text": "S"}], "tools": [{"name": "t"}], "tool_choice": "none"})
    assert body["messages"] == [{"role": "user", "content": [*prefix[0]["content"], {"type": "text",
                                                                                       "text": "Summarize."}]}]
    assert body["tool_choice"] == {"type": "none"} and body["system"] == [{"type": "text", "text": "S"}]
    assert prefix[0]["content"][0] == {"type": "text", "text": "q", "cache_control": {"type": "ephemeral"}}


async def test_overflow_and_errors_and_tool_calls(fake):
    system = Prompts().text("summarization-system")
    fake.window = 50
    with pytest.raises(SummarizerError) as e:
        await call(fake, [{"role": "system", "content": system}, {"role": "user", "content": "x " * 200}])
    assert e.value.kind == "overflow"
    fake.window = 200000
    fake.summarizer = FakeError.anthropic(529, "Overloaded", "overloaded_error")
    with pytest.raises(SummarizerError) as e:
        await call(fake, [{"role": "system", "content": system}, {"role": "user", "content": "y"}])
    assert e.value.kind == "http"
    fake.summarizer = {"tool_calls": [{"name": "Read", "input": {"path": "a"}}]}
    with pytest.raises(SummarizerError) as e:
        await call(fake, [{"role": "system", "content": system}, {"role": "user", "content": "z"}])
    assert e.value.reason == "tool_call"
