"""The proxy's own calls on the Messages API (summaries, tool-result notes): a non-streaming
POST /v1/messages to `anthropic.base_url` with the client's credentials and anthropic-version,
the same interface as proxy.upstream.UpstreamCaller, so the summarizers need not know the
protocol. Chat-shaped input is translated: leading system messages become `system`; a user
message following a user message (the cache-riding call appends one to a prefix that may end
with the user) is merged into it as one more text block, since roles must alternate;
`tool_choice: "none"` becomes Anthropic's `{"type": "none"}`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from multidict import CIMultiDict

from proxy.adapters.messages.body import blocks
from proxy.adapters.messages.overflow import is_prompt_too_long
from proxy.upstream import SummarizerError, post_json

DEFAULT_VERSION = "2023-06-01"


def to_messages_body(model: str, messages: list[dict[str, Any]], max_tokens: int,
                     extra: dict[str, Any] | None) -> dict[str, Any]:
    """The Messages body for a chat-shaped call (pure)."""
    extra = dict(extra or {})
    system = [m["content"] for m in messages if m.get("role") == "system" and isinstance(m.get("content"), str)]
    turns: list[dict[str, Any]] = []
    for m in messages:
        if m.get("role") == "system":
            continue
        if turns and turns[-1]["role"] == m["role"] == "user":
            prev = turns[-1]
            turns[-1] = {**prev, "content": [*_as_blocks(prev["content"]), *_as_blocks(m["content"])]}
        else:
            turns.append(m)
    if extra.get("tool_choice") == "none":
        extra["tool_choice"] = {"type": "none"}
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "messages": turns}
    if system and "system" not in extra:
        body["system"] = "\n\n".join(system)
    body.update(extra)
    body["stream"] = False
    return body


def _as_blocks(content: Any) -> list[Any]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(blocks(content))


def openai_usage(usage: Any) -> dict[str, Any]:
    """Anthropic's usage in the fields the bill reads (prompt = uncached + cache read + written)."""
    if not isinstance(usage, dict):
        return {}
    read = usage.get("cache_read_input_tokens") or 0
    prompt = (usage.get("input_tokens") or 0) + read + (usage.get("cache_creation_input_tokens") or 0)
    return {"prompt_tokens": prompt, "completion_tokens": usage.get("output_tokens") or 0,
            "prompt_tokens_details": {"cached_tokens": read}}


def answer_text(raw: bytes, usage: dict[str, Any] | None = None) -> str:
    try:
        data = orjson.loads(raw)
        content = data["content"]
        if usage is not None:
            usage.update(openai_usage(data.get("usage")))
    except (orjson.JSONDecodeError, KeyError, TypeError):
        raise SummarizerError("invalid", "the upstream's answer is not a Messages response") from None
    if not isinstance(content, list):
        raise SummarizerError("invalid", "the upstream's answer has no content blocks")
    if any(isinstance(b, dict) and b.get("type") == "tool_use" for b in content):
        raise SummarizerError("invalid", "the answer is a tool call, not a summary", reason="tool_call")
    return "".join(b["text"] for b in content if isinstance(b, dict) and b.get("type") == "text"
                   and isinstance(b.get("text"), str))


@dataclass
class MessagesCaller:
    session: aiohttp.ClientSession
    base_url: str
    connect_timeout_s: float

    async def complete(self, *, headers: dict[str, str], model: str, messages: list[dict[str, Any]],
                       max_output_tokens: int, timeout_s: float, usage: dict[str, Any] | None = None,
                       extra: dict[str, Any] | None = None) -> str:
        body = to_messages_body(model, messages, max_output_tokens, extra)
        status, raw = await self._post(headers, body, timeout_s)
        if status == 200:
            return answer_text(raw, usage)
        if is_prompt_too_long(status, raw):
            raise SummarizerError("overflow", "the summarizer's input exceeded the upstream context window")
        raise SummarizerError("http", f"upstream answered HTTP {status}")

    async def _post(self, headers: dict[str, str], body: dict[str, Any], timeout_s: float) -> tuple[int, bytes]:
        # anthropic-version is required; the client's own (in `headers`) wins.
        send = CIMultiDict({"anthropic-version": DEFAULT_VERSION})
        send.update(headers)
        return await post_json(self.session, self.base_url + "/v1/messages", dict(send), body, timeout_s,
                               self.connect_timeout_s)
