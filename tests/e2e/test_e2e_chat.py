"""Plain and streaming chat through the real proxy in front of the real llama.cpp server.

A request the proxy does not change goes upstream as the client sent it, and the server's answer
comes back as the server sent it: the tap between proxy and server sees both ends.
"""

import json

import pytest

pytestmark = pytest.mark.e2e

MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Name one primary colour."},
]


def _sse_text(raw: bytes) -> tuple[str, list[str | None]]:
    """Joined delta content and every finish_reason of an SSE body (comment lines skipped)."""
    text, finishes = [], []
    for line in raw.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        choice = json.loads(line[len("data: "):])["choices"][0]
        text.append(choice["delta"].get("content") or "")
        finishes.append(choice["finish_reason"])
    return "".join(text), finishes


def test_plain_chat_through_the_proxy(start_proxy, llama_server, tap):
    t = tap(llama_server)
    proxy = start_proxy(llama_server, upstream={"base_url": t.base_url})
    raw = proxy.client().chat.completions.with_raw_response.create(
        model=llama_server.model, messages=MESSAGES, max_tokens=16, temperature=0
    )
    completion = raw.parse()

    assert raw.status_code == 200
    assert raw.headers["x-compaction-status"] == "none"
    assert raw.headers["x-compaction-tokens-before"] == raw.headers["x-compaction-tokens-after"]
    assert int(raw.headers["x-compaction-tokens-before"]) > 0
    assert raw.headers["x-compaction-tool-results"] == "0"
    assert completion.object == "chat.completion"
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    assert 0 < completion.usage.completion_tokens <= 16

    [exchange] = t.exchanges
    assert exchange.kind == "chat" and exchange.status == 200
    assert exchange.body == {"model": llama_server.model, "messages": MESSAGES, "max_tokens": 16, "temperature": 0}
    assert raw.http_response.content == bytes(exchange.response)  # relayed byte for byte


def test_streaming_chat_through_the_proxy(start_proxy, llama_server, tap):
    t = tap(llama_server)
    proxy = start_proxy(llama_server, upstream={"base_url": t.base_url})
    raw = proxy.client().chat.completions.with_raw_response.create(
        model=llama_server.model, messages=MESSAGES, max_tokens=16, temperature=0, stream=True
    )
    chunks = list(raw.parse())

    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.headers["x-compaction-status"] == "none"
    assert raw.headers["x-compaction-tool-results"] == "0"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks]
    assert finishes[-1] in ("stop", "length") and not any(finishes[:-1])
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text.strip()

    [exchange] = t.exchanges
    assert exchange.kind == "chat" and exchange.status == 200
    assert exchange.body["stream"] is True and exchange.body["messages"] == MESSAGES
    # Every event the server sent reached the client, in order, and the stream ended with [DONE].
    upstream_text, upstream_finishes = _sse_text(bytes(exchange.response))
    assert (upstream_text, upstream_finishes) == (text, finishes)
    assert bytes(exchange.response).rstrip().endswith(b"data: [DONE]")
