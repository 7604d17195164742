"""Gemini Code Assist (issue 41 item 1: Gemini CLI signed in with Google, `/v1internal:...`):
compacted as the Gemini API when `gemini.code_assist_base_url` is set, the wrapper's other fields
sent on byte for byte, answers wrapped as `{"response": ...}`; relayed as it came when unset.
Raw HTTP (google-genai cannot speak Code Assist) to the strict fake (proxy/fakes/gemini)."""

from __future__ import annotations

import orjson
import pytest

from proxy.fakes.gemini import FakeGemini
from proxy.protocols.gemini import code_assist
from support.client import get, post
from support.gemini_driver import GEMINI
from support.protocols import tool_conversation

TOKEN = {"Authorization": "Bearer ya29.fake-oauth-token"}
MODEL = GEMINI.model
HEAD = {"model": MODEL, "project": "proj-7", "user_prompt_id": "prompt-1"}


@pytest.fixture
async def fake():
    async with FakeGemini() as f:
        yield f


def settings(fake, window: int = 6000):
    return {"models": {MODEL: {"context_window": window}}, "compaction": {"prepare_percent": 0},
            "tool_results": {"threshold_tokens": 500}, "gemini": {"code_assist_base_url": fake.base_url}}


def wrapped(messages=None, **inner) -> bytes:
    request = {**GEMINI.body(messages or tool_conversation()), **inner}
    return orjson.dumps({**HEAD, "request": request, "enabled_credit_types": []})


def head_of(raw: bytes) -> bytes:
    """The bytes of the wrapper before its request (its other fields as written)."""
    return raw[:raw.index(b'"request":')]


async def test_a_wrapped_call_is_compacted_and_its_wrapper_sent_on_as_it_came(fake, make_proxy):
    proxy = await make_proxy("http://127.0.0.1:9/v1", settings(fake))
    body = wrapped()
    answer = await post(proxy.root, body, TOKEN, path="/v1internal:generateContent", expect=200)
    assert answer.headers["x-compaction-status"] == "summarized"
    assert answer.json()["response"]["candidates"][0]["finishReason"] == "STOP"
    (call,) = fake.records("gemini")
    assert call.path == "/v1internal:generateContent" and call.headers["authorization"] == TOKEN["Authorization"]
    assert head_of(call.body) == head_of(body) and call.body.endswith(b',"enabled_credit_types":[]}')
    assert call.prompt_tokens < fake.count_input_tokens(orjson.loads(body)["request"])
    summaries = fake.records("summarizer")
    assert summaries and all(r.path == "/v1internal:generateContent" and r.wrapper["project"] == "proj-7"
                             and r.headers["authorization"] == TOKEN["Authorization"] for r in summaries)


async def test_a_streamed_call_is_compacted_and_relayed_as_wrapped_events(fake, make_proxy):
    proxy = await make_proxy("http://127.0.0.1:9/v1", settings(fake))
    answer = await post(proxy.root, wrapped(), TOKEN, path="/v1internal:streamGenerateContent?alt=sse", expect=200)
    assert answer.headers["x-compaction-status"] == "summarized"
    events = [orjson.loads(line[6:]) for line in answer.body.split(b"\r\n\r\n") if line.startswith(b"data: ")]
    assert events and all("response" in e for e in events)
    assert events[-1]["response"]["candidates"][0]["finishReason"] == "STOP"
    assert "error" not in answer.body.decode()  # the checker read the wrapped end: no incomplete-stream error
    assert fake.records("gemini")[-1].raw_path == "/v1internal:streamGenerateContent?alt=sse"


async def test_the_summary_is_reused_byte_for_byte_on_the_next_turn(fake, make_proxy):
    proxy = await make_proxy("http://127.0.0.1:9/v1", settings(fake))
    convo = tool_conversation()
    await post(proxy.root, wrapped(convo), TOKEN, path="/v1internal:generateContent", expect=200)
    made = len(fake.records("summarizer"))
    first = fake.records("gemini")[-1].json["contents"]
    later = convo + [{"role": "assistant", "content": "They list errors."}, {"role": "user", "content": "Go on."}]
    await post(proxy.root, wrapped(later), TOKEN, path="/v1internal:generateContent", expect=200)
    second = fake.records("gemini")[-1].json["contents"]
    assert len(fake.records("summarizer")) == made
    assert orjson.dumps(second[:len(first)]) == orjson.dumps(first)


async def test_count_tokens_counts_what_would_be_forwarded_now(fake, make_proxy):
    """Code Assist's count body is {"request": {"model": "models/...", "contents"}}, its answer
    {"totalTokens"}: after a compaction, the count is of the compacted contents; counting makes no summary."""
    proxy = await make_proxy("http://127.0.0.1:9/v1", settings(fake))
    contents = GEMINI.body(tool_conversation())["contents"]
    count = orjson.dumps({"request": {"model": f"models/{MODEL}", "contents": contents}})
    before = await post(proxy.root, count, TOKEN, path="/v1internal:countTokens", expect=200)
    assert fake.records("summarizer") == [] and before.json()["totalTokens"] <= fake.count_input_tokens(
        {"contents": contents})
    generate = orjson.dumps({**HEAD, "request": {"contents": contents}})
    await post(proxy.root, generate, TOKEN, path="/v1internal:generateContent", expect=200)
    forwarded = fake.records("gemini")[-1].prompt_tokens
    made = len(fake.records("summarizer"))
    after = await post(proxy.root, count, TOKEN, path="/v1internal:countTokens", expect=200)
    assert after.json() == {"totalTokens": forwarded} and forwarded < fake.count_input_tokens({"contents": contents})
    assert len(fake.records("summarizer")) == made and fake.count_requests[-1]["model"] == f"models/{MODEL}"


async def test_an_overflow_is_retried_compacted(make_proxy):
    """The proxy believes an 8000-token window (the request is under its threshold), the upstream's is 5000: the upstream's overflow 400 (in Code
    Assist's wrapper, Google's error shape) has the request compacted and sent once more."""
    async with FakeGemini(window=5000) as fake:
        proxy = await make_proxy("http://127.0.0.1:9/v1", settings(fake, window=8000))
        answer = await post(proxy.root, wrapped(), TOKEN, path="/v1internal:generateContent", expect=200)
        statuses = [r.status for r in fake.records("gemini")]
        assert statuses[0] == 400 and statuses[-1] == 200 and "response" in answer.json()


async def test_a_call_without_the_base_url_is_relayed_as_it_came(fake, make_proxy, monkeypatch):
    """Unset, Code Assist goes to Google's endpoint untouched (here the fake stands in for it)."""
    monkeypatch.setattr(code_assist, "CODE_ASSIST_URL", fake.base_url)
    proxy = await make_proxy("http://127.0.0.1:9/v1", {"models": {MODEL: {"context_window": 6000}}})
    body = wrapped()
    answer = await post(proxy.root, body, TOKEN, path="/v1internal:streamGenerateContent?alt=sse", expect=200)
    assert "x-compaction-status" not in answer.headers and fake.records("summarizer") == []
    (rec,) = fake.requests
    assert (rec.raw_path, rec.body) == ("/v1internal:streamGenerateContent?alt=sse", body)
    await get(proxy.root, "/v1internal/operations/op-1", TOKEN)
    assert fake.requests[-1].raw_path == "/v1internal/operations/op-1"


async def test_its_other_methods_are_relayed_as_they_came_when_set(fake, make_proxy):
    """Only the three model calls are compacted: the CLI's account calls (loadCodeAssist ...) go as they came."""
    proxy = await make_proxy("http://127.0.0.1:9/v1", settings(fake))
    body = b'{"metadata": {"ideType": "IDE_UNSPECIFIED"}}'
    answer = await post(proxy.root, body, TOKEN, path="/v1internal:loadCodeAssist", expect=200)
    assert "x-compaction-status" not in answer.headers and answer.json()["cloudaicompanionProject"]
    assert (fake.requests[-1].raw_path, fake.requests[-1].body) == ("/v1internal:loadCodeAssist", body)


async def test_a_body_without_a_request_goes_to_the_upstream_to_judge(fake, make_proxy):
    proxy = await make_proxy("http://127.0.0.1:9/v1", settings(fake))
    body = orjson.dumps({**HEAD, "contents": []})
    answer = await post(proxy.root, body, TOKEN, path="/v1internal:generateContent")
    assert answer.status == 400 and answer.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert fake.requests[-1].body == body


async def test_the_fake_requires_a_bearer_token(fake):
    answer = await post(fake.base_url, wrapped(), {}, path="/v1internal:generateContent")
    assert answer.status == 401 and answer.json()["error"]["status"] == "UNAUTHENTICATED"


async def test_the_wrapped_answers_usage_is_billed(fake, make_proxy):
    """usageMetadata sits inside `response`, whole or streamed: both answers are billed, none unbilled."""
    proxy = await make_proxy("http://127.0.0.1:9/v1", settings(fake, window=1_000_000))
    small = [{"role": "user", "content": "hi"}]
    await post(proxy.root, wrapped(small), TOKEN, path="/v1internal:generateContent", expect=200)
    await post(proxy.root, wrapped(small), TOKEN, path="/v1internal:streamGenerateContent?alt=sse", expect=200)
    total = (await get(proxy.root, "/admin/api/bill")).json()["total"]
    assert (total["requests"], total["unbilled"]) == (2, 0)


async def test_a_bad_inner_request_gets_googles_error_naming_its_field(fake, make_proxy):
    proxy = await make_proxy("http://127.0.0.1:9/v1", settings(fake))
    body = orjson.dumps({**HEAD, "request": {"contents": {"role": "user"}}})
    answer = await post(proxy.root, body, TOKEN, path="/v1internal:generateContent", expect=400)
    error = answer.json()["error"]
    assert error["status"] == "INVALID_ARGUMENT" and "contents" in error["message"] and fake.requests == []


def _history(n: int) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} caf\u00e9 " * 300} for i in range(n)]


def test_a_wrapped_body_that_grows_parses_as_a_full_parse_does():
    """The request's contents a body shares with the conversation's previous one are reused
    (`request.contents`, proxy/reuse.py): the same Request as a full parse, only the new contents
    written; an error in what is new is the full parse's."""
    from proxy import reuse
    from proxy.config import Config
    from proxy.model import Conversation
    from proxy.tokens import TokenCounter

    counter, cfg, recent = TokenCounter(), Config(), reuse.RecentBodies()
    counter.load()
    adapter = code_assist.CODE_ASSIST
    one, grown = wrapped(_history(7)), wrapped(_history(9))
    reuse.parse_seen(adapter, one, counter, cfg, "s", recent.prior("s", one), recent=recent).conversation.envelopes
    prior = recent.prior("s", grown)
    assert prior is not None and len(prior) == 7
    got, want = reuse.parse_seen(adapter, grown, counter, cfg, "s", prior, recent=recent), adapter.parse(grown, counter, cfg)
    assert (got.body, got.extra["wrapper"], got.model, got.keys, got.written, got.conversation.tokens) == \
        (want.body, want.extra["wrapper"], want.model, want.keys, want.written, want.conversation.tokens)
    assert [(e.kind, e.turn, e.cut_before, e.items, e.value) for e in got.conversation.envelopes] == \
        [(e.kind, e.turn, e.cut_before, e.items, e.value) for e in want.conversation.envelopes]
    shorter = [Conversation(list(r.conversation.envelopes[:-1]), r.conversation.tokens[:-1]) for r in (got, want)]
    assert adapter.render(got, got.conversation) == grown and adapter.render(got, shorter[0]) == adapter.render(want, shorter[1])
    body = orjson.loads(grown)
    body["request"]["contents"][-1]["role"] = "robot"  # a new content the upstream would refuse
    bad = orjson.dumps(body)
    assert len(recent.prior("s", bad)) == 8  # (the grown body kept: all but the changed one shared)
    with pytest.raises(Exception) as reused_error:
        reuse.parse_seen(adapter, bad, counter, cfg, "s", recent.prior("s", bad), recent=recent)
    with pytest.raises(Exception) as full_error:
        adapter.parse(bad, counter, cfg)
    assert str(reused_error.value) == str(full_error.value) and "valid role" in str(full_error.value)


async def test_a_conversations_next_wrapped_body_reuses_the_previous_ones_parse(fake, make_proxy, monkeypatch):
    from proxy import reuse

    priors: list = []
    real = reuse.parse_seen
    monkeypatch.setattr(reuse, "parse_seen", lambda *a, **kw: priors.append(a[5]) or real(*a, **kw))
    reuse.RECENT.clear()
    try:
        proxy = await make_proxy("http://127.0.0.1:9/v1", settings(fake, 1_000_000))
        bodies = [wrapped(_history(n)) for n in (7, 9, 11)]
        for raw in bodies:
            answer = await post(proxy.root, raw, TOKEN, path="/v1internal:generateContent", expect=200)
            assert answer.headers["x-compaction-status"] == "none"
    finally:
        reuse.RECENT.clear()
    assert len(bodies[0]) > reuse.MIN_BYTES
    assert [None if p is None else len(p) for p in priors] == [None, 7, 9]
    assert [r.body for r in fake.requests] == bodies  # forwarded as they came


async def test_what_a_callers_headers_say_is_worked_out_once(fake, make_proxy, monkeypatch):
    """The OAuth token's scope (an HMAC) and the upstream headers, once per header list
    (code_assist.CALLERS): a client's next request with the same headers works out none."""
    from proxy import credentials

    resolved: list[str] = []
    real = credentials.resolve
    monkeypatch.setattr(credentials, "resolve",
                        lambda headers, *a, **kw: resolved.append(headers["Authorization"]) or real(headers, *a, **kw))
    code_assist.CALLERS.clear()
    proxy = await make_proxy("http://127.0.0.1:9/v1", settings(fake, 1_000_000))
    other = {"Authorization": "Bearer ya29.another-token"}
    for headers in (TOKEN, TOKEN, other, TOKEN):
        answer = await post(proxy.root, wrapped(_history(3)), headers, path="/v1internal:generateContent", expect=200)
        assert answer.headers["x-compaction-status"] == "none"
    assert resolved == [TOKEN["Authorization"], other["Authorization"]]
    assert [r.headers["authorization"] for r in fake.requests] == [h["Authorization"] for h in (TOKEN, TOKEN, other, TOKEN)]
