"""The recorded Codex session replayed through the proxy as Codex sends it (issue 14): the first
requests as zstd-compressed HTTP bodies, the rest as `response.create` messages on one WebSocket,
against the strict fake (the session's reasoning items are signed for it: it checks they come back
unchanged before what they preceded, and that every call is answered). The session outgrows the
window: the large file read becomes a note, the history is summarized once, and the summary is
then carried byte for byte; no forwarded request is over the window."""

from __future__ import annotations

import json

import pytest

from proxy.fakes.responses import FakeResponses
from proxy.fakes.responses.validate import Context, check_request
from proxy.fakes.signing import Signer
from support.codex_replay import replay_codex, summary_items
from support.sessions import FIXTURE_SIGNING_KEY, codex_requests

WINDOW = 3200  # (3000 before socket turns declared the recall tool: ~150 tokens more per request)
SETTINGS = {"models": {"default": {"context_window": WINDOW}},
            "compaction": {"prepare_percent": 0, "keep_recent_tokens": 800}}


@pytest.fixture
async def fake():
    async with FakeResponses(window=WINDOW, signing_key=FIXTURE_SIGNING_KEY) as f:
        f.reply = "Done with that step."
        yield f


async def test_codex_session_over_http_and_websocket(fake, make_proxy):
    proxy = await make_proxy(fake.base_url, SETTINGS)
    result = await replay_codex(proxy.base_url, http_requests=2)
    assert [t.end for t in result.turns] == ["response.completed"] * len(codex_requests())
    assert [t.transport for t in result.turns[:3]] == ["http", "http", "websocket"]

    forwarded = fake.records("responses")
    assert len(forwarded) == len(result.turns) and all(r.status == 200 for r in forwarded)
    # zstd bodies went upstream decoded, with their own length
    for r in forwarded[:2]:
        assert "content-encoding" not in r.headers and r.headers["content-length"] == str(len(r.body))
    # every forwarded request is one OpenAI accepts: each call with its output, each reasoning
    # item unchanged and right before what it preceded
    ctx = Context(signer=Signer(FIXTURE_SIGNING_KEY), websocket=True)
    for r in forwarded:
        check_request(r.json, ctx)
    # the session outgrew the window; what went upstream never did
    last = codex_requests()[-1]
    assert fake.count_input_tokens(last, last["input"]) > WINDOW
    assert max(r.prompt_tokens for r in forwarded) <= WINDOW

    # summarized once, then carried byte for byte
    summaries = summary_items([r.json for r in forwarded])
    first = next(i for i, s in enumerate(summaries) if s)
    assert first >= 2  # on the socket
    assert set(summaries[first:]) == {summaries[first]} and not any(summaries[:first])
    for a, b in zip(forwarded[first:], forwarded[first + 1:]):
        k = next(i for i, it in enumerate(a.json["input"]) if "<summary>" in json.dumps(it))
        assert b.json["instructions"] == a.json["instructions"]
        assert b.json["input"][:k + 1] == a.json["input"][:k + 1]
    history_calls = [i for i, r in enumerate(fake.requests) if r.summarizer_kind == "history"]
    at = fake.requests.index(forwarded[first])
    prev = fake.requests.index(forwarded[first - 1])
    assert history_calls and all(prev < i < at for i in history_calls)  # all made for that one request
    # and the client was told so on the socket, turn by turn (response.created's metadata)
    told = [t.compaction for t in result.turns]
    assert told[first] == "summarized" and set(told[first + 1:]) == {"reused"}, told
    assert None not in told
    # the large file read became a note (a tool summary) before the history needed compacting
    assert [r.summarizer_kind for r in fake.records("summarizer")].count("tool") == 1
