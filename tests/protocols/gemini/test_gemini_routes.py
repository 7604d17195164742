"""The Gemini routes (issue 41 item 1): which paths are Gemini's, the credential from
x-goog-api-key or `?key=` (scoped alike, forwarded as it came, never shown), errors in Google's
shape, and countTokens counting what would be forwarded now. Through the real google-genai
client (or raw HTTP where exact bytes matter) to the strict fake (proxy/fakes/gemini)."""

from __future__ import annotations

import json
import logging

import pytest
from google.genai import errors as genai_errors

from proxy.fakes.gemini import FakeGemini
from support.client import get, http, post
from support.gemini_driver import GEMINI, gemini_client
from support.protocols import tool_conversation

SECRET = "AIzaSy-secret-key-in-the-query-0123456789"
WINDOW = 6000


def settings(fake, window: int = WINDOW, **over):
    return GEMINI.settings(fake, window, **{"compaction": {"prepare_percent": 0},
                                            "tool_results": {"threshold_tokens": 500}, **over})


@pytest.fixture
async def fake():
    async with FakeGemini() as f:
        yield f


def raw_body() -> bytes:
    return GEMINI.raw_body(tool_conversation())


@pytest.mark.parametrize("version", ["v1", "v1beta", "v1alpha"])
async def test_a_models_method_path_is_gemini_whatever_its_version(fake, make_proxy, version):
    """google-genai sends /v1 by default: before this, /v1/models/x:generateContent fell into the
    OpenAI pass-through."""
    proxy = await make_proxy("http://127.0.0.1:9/v1", settings(fake))
    path = f"/{version}/models/gemini-2.5-flash:generateContent"
    answer = await post(proxy.root, raw_body(), {"x-goog-api-key": "k-1"}, path=path, expect=200)
    assert answer.headers["x-compaction-status"] == "summarized"
    assert [r.path for r in GEMINI.model_calls(fake)] == [path]


async def test_other_gemini_paths_pass_through_and_openai_keeps_v1_models(fake, upstream, make_proxy):
    proxy = await make_proxy(upstream.base_url, settings(fake))
    listed = await get(proxy.root, "/v1beta/models?pageSize=5", {"x-goog-api-key": "k-1"})
    assert listed.status == 404 and listed.json()["error"]["status"] == "NOT_FOUND"  # the fake's own answer
    embed = await post(proxy.root, b'{"content": {"parts": [{"text": "x"}]}}', {"x-goog-api-key": "k-1"},
                       path="/v1beta/models/text-embedding-004:embedContent")
    assert embed.status == 404
    assert [(r.method, r.raw_path) for r in fake.requests] == [
        ("GET", "/v1beta/models?pageSize=5"), ("POST", "/v1beta/models/text-embedding-004:embedContent")]
    models = await get(proxy.root, "/v1/models", {"Authorization": "Bearer sk-openai"})
    assert models.status == 200 and len(fake.requests) == 2  # OpenAI's /v1/models, not Google's


async def test_a_key_in_the_query_is_forwarded_as_it_came_and_scopes_as_the_header_does(fake, make_proxy):
    proxy = await make_proxy("http://127.0.0.1:9/v1", settings(fake))
    path = "/v1beta/models/gemini-2.5-flash:generateContent"
    first = await post(proxy.root, raw_body(), {}, path=f"{path}?key={SECRET}", expect=200)
    assert first.headers["x-compaction-status"] == "summarized"
    call = GEMINI.model_calls(fake)[-1]
    assert call.raw_path == f"{path}?key={SECRET}" and "x-goog-api-key" not in call.headers
    # the proxy's own calls carry the key as the header, never in a URL it writes
    summarizer = fake.records("summarizer")
    assert summarizer and all(r.headers.get("x-goog-api-key") == SECRET and r.query_string == "" for r in summarizer)
    n = len(summarizer)
    again = await post(proxy.root, raw_body(), {"x-goog-api-key": SECRET}, path=path, expect=200)
    assert again.headers["x-compaction-status"] == "reused" and len(fake.records("summarizer")) == n
    other = await post(proxy.root, raw_body(), {}, path=f"{path}?key=another-key", expect=200)
    assert other.headers["x-compaction-status"] == "summarized"  # another key: nothing of the first's


async def test_a_key_in_the_query_is_never_logged_journaled_or_a_metric(fake, make_proxy, caplog):
    caplog.set_level(logging.DEBUG)
    proxy = await make_proxy("http://127.0.0.1:9/v1", settings(fake))
    path = "/v1beta/models/gemini-2.5-flash"
    await post(proxy.root, raw_body(), {}, path=f"{path}:generateContent?key={SECRET}", expect=200)
    await post(proxy.root, raw_body(), {}, path=f"{path}:streamGenerateContent?alt=sse&key={SECRET}", expect=200)
    await post(proxy.root, raw_body(), {}, path=f"{path}:countTokens?key={SECRET}", expect=200)
    await get(proxy.root, f"/v1beta/models?key={SECRET}")
    await fake.stop()  # the upstream gone: the errors say so, without the URL's query
    down = await post(proxy.root, raw_body(), {}, path=f"{path}:generateContent?key={SECRET}")
    assert down.status == 502 and SECRET not in down.body.decode()
    assert down.json()["error"]["status"] == "UNAVAILABLE"
    await proxy.state.journal.flush()
    events = (await get(proxy.root, "/admin/api/events")).body.decode()
    metrics = (await get(proxy.root, "/metrics")).body.decode()
    # every line as written (the proxy's access line: its fields too; aiohttp's own request line,
    # which the test servers write and the proxy's runner turns off, redacted all the same)
    logged = "\n".join(f"{r.getMessage()} {getattr(r, 'fields', '')} {r.exc_text or ''}" for r in caplog.records)
    assert "gemini" in metrics and "request" in logged
    for where, text in (("journal", events), ("metrics", metrics), ("logs", logged)):
        assert SECRET not in text, where


async def test_errors_are_in_googles_shape_and_the_sdk_raises_its_own(fake, make_proxy):
    proxy = await make_proxy("http://127.0.0.1:9/v1", settings(fake))
    path = "/v1beta/models/gemini-2.5-flash:generateContent"
    for body, words in ((b'{"contents": "hello"}', "contents"), (b'{"contents": [', "Invalid JSON payload"),
                        (b'{"contents": [{"role": "robot", "parts": [{"text": "x"}]}]}', "valid role")):
        answer = await post(proxy.root, body, {"x-goog-api-key": "k-1"}, path=path, expect=400)
        err = answer.json()["error"]
        assert (err["code"], err["status"]) == (400, "INVALID_ARGUMENT") and words in err["message"], err
        assert set(err) == {"code", "message", "status"}
    assert fake.requests == []  # refused here, with the API's wording
    client = gemini_client(proxy, "k-1")
    with pytest.raises(genai_errors.ClientError) as exc:
        await client.aio.models.generate_content(model="gemini-2.5-flash",
                                                 contents=[{"role": "robot", "parts": [{"text": "x"}]}])
    assert exc.value.code == 400 and exc.value.status == "INVALID_ARGUMENT"


async def test_count_tokens_counts_what_would_be_forwarded_now(fake, make_proxy):
    """Gemini CLI decides its own compression from countTokens: after a compaction, the count is
    of the compacted request (the upstream's count of it), and counting makes no summary."""
    proxy = await make_proxy("http://127.0.0.1:9/v1", settings(fake))
    convo = tool_conversation()
    body = {"contents": GEMINI.body(convo)["contents"]}  # countTokens takes the contents alone
    count_path = "/v1beta/models/gemini-2.5-flash:countTokens"
    before = await post(proxy.root, json.dumps(body).encode(), {"x-goog-api-key": "k-1"}, path=count_path, expect=200)
    assert fake.records("summarizer") == []  # counting makes nothing
    as_sent = fake.count_input_tokens(body)
    assert before.json()["totalTokens"] <= as_sent
    await post(proxy.root, json.dumps(body).encode(), {"x-goog-api-key": "k-1"},
               path="/v1beta/models/gemini-2.5-flash:generateContent", expect=200)
    forwarded = GEMINI.model_calls(fake)[-1].prompt_tokens
    made = len(fake.records("summarizer"))
    client = gemini_client(proxy, "k-1")
    counted = await client.aio.models.count_tokens(model="gemini-2.5-flash", contents=body["contents"])
    assert counted.total_tokens == forwarded < as_sent
    assert len(fake.records("summarizer")) == made and fake.count_requests[-1]["contents"] != body["contents"]


async def test_a_count_of_a_wrapped_request_goes_to_the_upstream_as_it_came(fake, make_proxy):
    """countTokens also takes {"generateContentRequest": {...}}: what the upstream accepts, the
    proxy does not refuse; it forwards it as it came."""
    proxy = await make_proxy("http://127.0.0.1:9/v1", settings(fake))
    body = json.dumps({"generateContentRequest": {"model": "models/gemini-2.5-flash", "contents": [
        {"role": "user", "parts": [{"text": "hi"}]}]}}).encode()
    answer = await post(proxy.root, body, {"x-goog-api-key": "k-1"}, path="/v1beta/models/gemini-2.5-flash:countTokens",
                        expect=200)
    assert answer.headers["x-compaction-status"] == "none" and fake.requests[-1].body == body
    assert answer.json()["totalTokens"] > 0


async def test_what_a_callers_headers_and_query_key_say_is_worked_out_once(fake, make_proxy, monkeypatch):
    """The credential's scope (an HMAC) and the upstream headers are worked out once per header
    list and `?key=` (protocol.CALLERS), as the other protocols' are per header list: a client's
    next request with the same ones works out none; another key in the query is another caller."""
    from proxy import credentials
    from proxy.protocols.gemini import protocol

    resolved: list[str | None] = []
    real = credentials.resolve
    monkeypatch.setattr(credentials, "resolve",
                        lambda headers, *a, **kw: resolved.append(headers.get("x-goog-api-key")) or real(headers, *a, **kw))
    protocol.CALLERS.clear()
    proxy = await make_proxy("http://127.0.0.1:9/v1", settings(fake, 1_000_000))
    path = "/v1beta/models/gemini-2.5-flash:generateContent"
    body = GEMINI.raw_body([{"role": "user", "content": "hi"}])
    for headers, query in (({"x-goog-api-key": "k-1"}, ""), ({"x-goog-api-key": "k-1"}, ""), ({}, "?key=q-1"),
                           ({}, "?key=q-1"), ({}, "?key=q-2")):
        answer = await post(proxy.root, body, headers, path=path + query, expect=200)
        assert answer.headers["x-compaction-status"] == "none"
    assert resolved == ["k-1", "q-1", "q-2"]
    assert [r.raw_path for r in GEMINI.model_calls(fake)][2:] == [f"{path}?key=q-1"] * 2 + [f"{path}?key=q-2"]
