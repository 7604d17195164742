"""The overflow path for real: the upstream's own context_length_exceeded, then compaction and retry.

The proxy believes the model has a 4096-token window while the server runs with n_ctx 2048, so the
proxy does not compact on its own and forwards a ~2,300-token request, which the real server
rejects. Nothing has reached the client yet, so the proxy compacts with half the threshold and
retries once (design.md § Failure and overflow). The summarizer's own first call overflows the small server too and is
halved (design.md § Budgets and folding). The proxy accepts the real model's summary (`summarized`) or, when the model
replied instead of summarizing, refuses it and falls back to a digest written by code
(`degraded`); either way the retry succeeds.
"""

from __future__ import annotations

import openai
import pytest

from support.compaction_helpers import chat_history, proxy_count
from support.invariants import check_forwarded


pytestmark = pytest.mark.e2e

PROXY_WINDOW = 4096  # threshold 3482: the request below stays under it


def _is_overflow(body: dict) -> bool:
    return body["error"]["code"] == "context_length_exceeded"


def _is_transcript(call) -> bool:
    return any("<conversation>" in str(m.get("content")) for m in call.body["messages"])


def _prompt_chars(call) -> int:
    return sum(len(str(m.get("content"))) for m in call.body["messages"])


def test_upstream_overflow_is_compacted_and_retried(start_proxy, llama_server_small, tap):
    messages = chat_history(6, 120)  # ~2,300 tokens for the proxy and for SmolLM2's tokenizer alike
    assert proxy_count({"model": llama_server_small.model, "messages": messages}) < 0.85 * PROXY_WINDOW
    t = tap(llama_server_small)
    proxy = start_proxy(
        llama_server_small,
        upstream={"base_url": t.base_url},
        models={llama_server_small.model: {"context_window": PROXY_WINDOW}},
        compaction={
            "reserve_tokens": 200,  # summary output cap 160 tokens
            "keep_recent_tokens": 400,  # the cut lands before the last user turn: no split turn
            "prepare_percent": 0,
            "summarizer_timeout_s": 600,
            "required_headings": [],  # a 135M model cannot follow the full format
        },
    )
    client = proxy.client(timeout=900)

    raw = error = None
    try:
        raw = client.chat.completions.with_raw_response.create(
            model=llama_server_small.model, messages=messages, max_tokens=16, temperature=0
        )
    except openai.BadRequestError as e:
        error = e
    chats = t.of_kind("chat")
    summarizer_calls = t.of_kind("history")

    # The real server's own rejection of the first forward, which the proxy acted on.
    first = t.exchanges[0]
    assert (first.kind, first.status) == ("chat", 400) and _is_overflow(first.response_json())
    assert first.body["messages"] == messages
    assert summarizer_calls, "no compaction after the upstream's overflow"
    for call, after in zip(summarizer_calls, summarizer_calls[1:] + [None]):
        if call.status == 400:  # the summarizer's input overflowed too: never the same call again
            assert _is_overflow(call.response_json())
            assert after is not None, "the proxy gave up after the summarizer's overflow"
            assert after.body != call.body
            # Within one form the next call is smaller; the cache-riding form (the conversation's
            # own messages plus one instruction) falls back to the transcript form.
            if _is_transcript(after) == _is_transcript(call):
                assert _prompt_chars(after) < _prompt_chars(call)

    assert raw is not None, f"the retry did not succeed: {error}"
    completion = raw.parse()
    status = raw.headers["x-compaction-status"]
    # SmolLM2 sometimes answers the transcript instead of summarizing it ("I'm so glad to hear
    # ..."): the proxy refuses that answer and the code-written digest makes the retry fit.
    if status == "degraded":
        assert "summary rejected (" in proxy.log_text() or "summary failed" in proxy.log_text()
    else:
        assert status == "summarized"
    assert int(raw.headers["x-compaction-tokens-after"]) < int(raw.headers["x-compaction-tokens-before"])
    assert completion.choices[0].finish_reason in ("stop", "length")
    assert [c.status for c in chats] == [400, 200]
    check_forwarded(messages, chats[1].body["messages"], compacted=True)
    print(f"\noverflow: summarizer calls {[c.status for c in summarizer_calls]}; client got 200 {status}")
