"""The streaming overflow for real: llama.cpp answers a streaming request whose prompt is over its
window with HTTP 200 and an EMPTY event stream (no event, no [DONE]; docs/e2e-llama-server-notes.md).
The proxy peeks at the first bytes before answering its client, treats the empty stream as an
overflow, compacts at half the threshold and retries once: the client gets a real stream. (The
offline counterpart, with every forwarded request checked, is in tests/reliability/test_reliability_faults.py.)

Same set-up as test_e2e_overflow.py (the proxy believes 4096 tokens, the server has 2048), with
`stream: true`.
"""

from __future__ import annotations

import pytest

from support.compaction_helpers import chat_history, proxy_count

pytestmark = pytest.mark.e2e

PROXY_WINDOW = 4096


def test_an_empty_stream_from_llama_cpp_is_compacted_and_retried(start_proxy, llama_server_small):
    """Straight to the server, no tap in between: uvicorn closes the connection right after the
    empty stream, and the proxy's own next call (the summarizer's) must not trip over it."""
    messages = chat_history(6, 120)
    assert proxy_count({"model": llama_server_small.model, "messages": messages}) < 0.85 * PROXY_WINDOW
    proxy = start_proxy(
        llama_server_small,
        models={llama_server_small.model: {"context_window": PROXY_WINDOW}},
        compaction={
            "reserve_tokens": 200,
            "keep_recent_tokens": 400,
            "prepare_percent": 0,
            "summarizer_timeout_s": 600,
            "required_headings": [],  # a 135M model cannot follow the full format
        },
    )
    client = proxy.client(timeout=900)

    raw = client.chat.completions.with_raw_response.create(
        model=llama_server_small.model, messages=messages, max_tokens=16, temperature=0, stream=True
    )
    chunks = list(raw.parse())
    assert raw.headers["x-compaction-status"] == "summarized"
    assert int(raw.headers["x-compaction-tokens-after"]) < int(raw.headers["x-compaction-tokens-before"])
    assert chunks and any(c.choices and c.choices[0].finish_reason for c in chunks)
    assert proxy.stop() == 0
    log = proxy.log_text()
    assert log.count("upstream sent an empty event stream; retrying compacted") == 1, log[-3000:]
    assert "compaction failed open" not in log
