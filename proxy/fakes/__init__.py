"""Strict fake upstreams for tests and demos: real aiohttp servers on 127.0.0.1 that validate
like the provider they stand for.

- `proxy.fakes.chat.FakeUpstream`: OpenAI Chat Completions (and models, embeddings, echo).
- `proxy.fakes.responses.FakeResponses`: OpenAI Responses over HTTP, SSE and WebSocket, and
  `/v1/responses/compact`.
- `proxy.fakes.messages.FakeMessages`: Anthropic Messages and `count_tokens`.

Shared pieces: `server` (lifecycle and recording), `common` (errors, counting, helpers),
`openai_errors` (OpenAI's error answers, for both OpenAI fakes),
`prompt_cache` (prefix caches), `signing` (opaque signed tokens), `summarizer_match` (telling the
proxy's summarizer calls apart) and `chat_view` (a chat-shaped view for scripted answers).
"""
