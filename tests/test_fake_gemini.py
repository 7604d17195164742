"""The strict fake Gemini API (proxy/fakes/gemini) refuses what Google's API refuses, in its
words and shape, and answers as it answers (usage, the implicit prefix cache, SSE), so that a
request it accepts from the proxy is one Google would accept."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.fakes.gemini import FakeGemini
from support.client import post
from support.gemini_driver import gemini_client

PATH = "/v1beta/models/gemini-2.5-flash:generateContent"


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "parts": [{"text": text}]}


def call(name: str, id_: str | None = None) -> dict[str, Any]:
    fc = {"name": name, "args": {}, **({"id": id_} if id_ else {})}
    return {"role": "model", "parts": [{"functionCall": fc}]}


def answer(*names: str, id_: str | None = None) -> dict[str, Any]:
    return {"role": "user", "parts": [{"functionResponse": {"name": n, "response": {"output": "x"},
                                                            **({"id": id_} if id_ else {})}} for n in names]}


REFUSED = {
    "no-contents": ({}, "contents is not specified"),
    # (two plain user contents in a row are taken, as the API takes Gemini CLI's routing call)
    "roles-repeat": ({"contents": [user("a"), {"role": "model", "parts": [{"text": "b"}]},
                                   {"role": "model", "parts": [{"text": "c"}]}]}, "alternate between user and model"),
    "bad-role": ({"contents": [user("a"), {"role": "assistant", "parts": [{"text": "b"}]}]}, "valid role"),
    "empty-parts": ({"contents": [{"role": "user", "parts": []}]}, "must not be empty"),
    "two-data": ({"contents": [{"role": "user", "parts": [{"text": "a", "inlineData": {}}]}]}, "oneof field 'data'"),
    "response-without-call": ({"contents": [user("a"), {"role": "model", "parts": [{"text": "b"}]}, answer("ls")]},
                              "comes immediately after a function call turn"),
    "response-count": ({"contents": [user("a"), call("ls"), answer("ls", "cat")]}, "number of function response"),
    "response-name": ({"contents": [user("a"), call("ls"), answer("cat")]}, "names match"),
    "response-id": ({"contents": [user("a"), call("ls", "c1"), answer("cat", id_="c1")]}, "does not match the name"),
}


@pytest.mark.parametrize("case", REFUSED, ids=list(REFUSED))
async def test_what_the_api_refuses_is_a_400_in_its_words(case):
    body, words = REFUSED[case]
    async with FakeGemini() as fake:
        got = await post(fake.base_url, json.dumps(body).encode(), {"x-goog-api-key": "k"}, path=PATH, expect=400)
    err = got.json()["error"]
    assert (err["code"], err["status"]) == (400, "INVALID_ARGUMENT") and words in err["message"], err


async def test_a_key_is_required_and_checked_in_the_header_or_the_query():
    body = json.dumps({"contents": [user("hi")]}).encode()
    async with FakeGemini(require_api_key="right") as fake:
        none = await post(fake.base_url, body, {}, path=PATH, expect=403)
        assert none.json()["error"]["status"] == "PERMISSION_DENIED"
        wrong = await post(fake.base_url, body, {"x-goog-api-key": "wrong"}, path=PATH, expect=400)
        assert "API key not valid" in wrong.json()["error"]["message"]
        await post(fake.base_url, body, {}, path=PATH + "?key=right", expect=200)


async def test_over_the_window_is_googles_exact_overflow_error():
    async with FakeGemini(window=50) as fake:
        got = await post(fake.base_url, json.dumps({"contents": [user("word " * 100)]}).encode(),
                         {"x-goog-api-key": "k"}, path=PATH, expect=400)
        n = fake.requests[-1].prompt_tokens
    assert got.json()["error"]["message"] == f"The input token count ({n}) exceeds the maximum number of tokens allowed (50)."


async def test_usage_reports_the_implicit_prefix_cache_and_streams_end_with_a_finish_reason():
    async with FakeGemini(cache_min_tokens=100) as fake:
        client = gemini_client(fake, "k")
        long = [user("context " * 300)]
        first = await client.aio.models.generate_content(model="gemini-2.5-flash", contents=long)
        assert first.usage_metadata.cached_content_token_count is None
        chunks = [c async for c in await client.aio.models.generate_content_stream(
            model="gemini-2.5-flash", contents=[*long, {"role": "model", "parts": [{"text": "ok"}]}, user("more")])]
        last = chunks[-1]
        assert last.candidates[0].finish_reason == "STOP" and len(chunks) >= 1
        assert last.usage_metadata.cached_content_token_count == first.usage_metadata.prompt_token_count
        assert fake.records("gemini")[-1].query["alt"] == "sse"  # google-genai streams over SSE
