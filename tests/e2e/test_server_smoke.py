"""The llama.cpp upstream itself works (proves the fixtures; no proxy involved)."""

import pytest

pytestmark = pytest.mark.e2e

MESSAGES = [{"role": "user", "content": "Say hello in one short sentence."}]


def test_plain_chat(llama_server):
    r = llama_server.client().chat.completions.create(
        model=llama_server.model, messages=MESSAGES, max_tokens=20, temperature=0
    )
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content.strip()
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0


def test_streaming_chat(llama_server):
    stream = llama_server.client().chat.completions.create(
        model=llama_server.model, messages=MESSAGES, max_tokens=20, temperature=0, stream=True
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_small_server_context_limit(llama_server_small):
    client = llama_server_small.client()
    with pytest.raises(Exception) as exc:
        client.chat.completions.create(
            model=llama_server_small.model,
            messages=[{"role": "user", "content": "word " * 3000}],
            max_tokens=5,
        )
    assert getattr(exc.value, "status_code", None) == 400
