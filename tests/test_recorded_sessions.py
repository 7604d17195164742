"""The recorded Codex-style and Claude Code-style sessions (tests/fixtures/sessions) replayed
straight against the strict fakes: every request of each passes validation, over HTTP (and for
Codex over the WebSocket too); the same requests fail under another signing key, so the replay
really checks the opaque parts; and the sessions are long enough to cross a small threshold."""

from __future__ import annotations

import json

import aiohttp
import pytest
from openai import BadRequestError

from proxy.fakes.messages import FakeMessages
from proxy.fakes.responses import FakeResponses
from proxy.fakes.responses.items import input_items, item_type
from support.client import anthropic_client, openai_client
from support.sessions import FIXTURE_SIGNING_KEY, claude_requests, codex_requests

THRESHOLD = 8000  # a small compaction threshold the tests of issues 14 and 15 can use


def test_sessions_have_the_shapes_they_stand_for():
    codex = codex_requests()
    last = codex[-1]["input"]
    types = {item_type(i) for i in last}
    assert {"reasoning", "function_call", "function_call_output", "custom_tool_call",
            "custom_tool_call_output"} <= types
    assert all(i.get("encrypted_content") for i in last if item_type(i) == "reasoning")
    assert max(len(i["output"]) for i in last if item_type(i) == "function_call_output") > 30000  # large read
    claude = claude_requests()
    blocks = [b for m in claude[-1]["messages"] for b in m["content"] if isinstance(b, dict)]
    assert sum(b["type"] == "tool_use" for b in blocks) >= 10
    thinking = [b for b in blocks if b["type"] == "thinking"]
    assert thinking and all(b["signature"] for b in thinking)
    assert all("cache_control" in b for b in claude[-1]["system"])
    assert max(len(b["content"]) for b in blocks if b["type"] == "tool_result") > 30000


async def test_codex_session_replays_against_the_responses_fake():
    async with FakeResponses(signing_key=FIXTURE_SIGNING_KEY, reply="ok") as fake:
        async with openai_client(fake, "sk-test") as client:
            for body in codex_requests():
                stream = await client.responses.create(**body)
                events = [e.type async for e in stream]
                assert events[-1] == "response.completed"
        recs = fake.records("responses")
        assert [r.status for r in recs] == [200] * len(codex_requests())
        assert recs[0].prompt_tokens < THRESHOLD < recs[-1].prompt_tokens
        # Codex resends the same prefix: from the large read on, the cache covers most of it
        assert recs[-1].cached_tokens > 0.8 * recs[-1].prompt_tokens


async def test_codex_session_replays_over_the_websocket():
    async with FakeResponses(signing_key=FIXTURE_SIGNING_KEY, reply="ok") as fake:
        ws_url = fake.base_url.replace("http://", "ws://") + "/responses"
        async with aiohttp.ClientSession() as s:
            async with s.ws_connect(ws_url, headers={"Authorization": "Bearer sk-test"}) as ws:
                for body in codex_requests():
                    body.pop("stream")
                    await ws.send_str(json.dumps({"type": "response.create", **body}))
                    while True:
                        event = json.loads((await ws.receive()).data)
                        if event["type"] in ("response.completed", "error"):
                            break
                    assert event["type"] == "response.completed", event
        assert len([r for r in fake.requests if r.transport == "websocket"]) == len(codex_requests())


async def test_codex_session_fails_under_another_key():
    async with FakeResponses(reply="ok") as fake:  # a different provider account
        body = next(b for b in codex_requests() if any(item_type(i) == "reasoning" for i in input_items(b)))
        async with openai_client(fake, "sk-test") as client:
            with pytest.raises(BadRequestError) as e:
                await client.responses.create(**{**body, "stream": False})
        assert e.value.code == "invalid_encrypted_content"


async def test_claude_session_replays_against_the_messages_fake():
    async with FakeMessages(signing_key=FIXTURE_SIGNING_KEY, reply="ok") as fake:
        usages = []
        async with anthropic_client(fake, "sk-ant-test") as client:
            for body in claude_requests():
                body.pop("stream")
                async with client.messages.stream(**body) as s:
                    final = await s.get_final_message()
                usages.append(u := final.usage)
                counted = await client.messages.count_tokens(**{k: v for k, v in body.items()
                                                                if k not in ("max_tokens", "metadata")})
                assert counted.input_tokens == (u.input_tokens + u.cache_read_input_tokens
                                                + u.cache_creation_input_tokens)
        recs = fake.records("messages")
        assert [r.status for r in recs] == [200] * len(claude_requests())
        assert recs[0].prompt_tokens < THRESHOLD < recs[-1].prompt_tokens
        # The first request is under the model's minimum cacheable length (1024): nothing cached.
        # From then on each request reads exactly what the one before wrote at its breakpoints.
        assert usages[0].cache_creation_input_tokens == usages[0].cache_read_input_tokens == 0
        assert usages[1].cache_creation_input_tokens > 1024
        for before, after in zip(usages[1:], usages[2:]):
            assert after.cache_read_input_tokens == before.cache_read_input_tokens + before.cache_creation_input_tokens


async def test_claude_session_fails_under_another_key():
    async with FakeMessages(reply="ok") as fake:
        async with aiohttp.ClientSession() as s:
            body = {**claude_requests()[1], "stream": False}
            async with s.post(fake.base_url + "/v1/messages", json=body,
                              headers={"x-api-key": "k", "anthropic-version": "2023-06-01"}) as r:
                payload = await r.json()
    assert r.status == 400 and payload["error"]["message"] == "messages.1.content.0: Invalid `signature` in `thinking` block"
