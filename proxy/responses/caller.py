"""The proxy's own upstream calls as Responses calls: the same `complete` as UpstreamCaller
(proxy/upstream.py), for an upstream that speaks the Responses API (the summarizer of a Responses
conversation, and /v1/responses/compact served locally).

System messages become `instructions`, the rest input messages; the call is non-streaming with
`store: false` (nothing of it is kept upstream). An answer that is a tool call, not text, is not
a summary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from proxy.upstream import SummarizerError, is_context_overflow, post_json

MIN_OUTPUT_TOKENS = 16  # the Responses API refuses a smaller max_output_tokens


def responses_body(model: str, messages: list[dict[str, Any]], max_output_tokens: int) -> dict[str, Any]:
    system = [m["content"] for m in messages if m.get("role") in ("system", "developer")]
    items = [{"type": "message", "role": "assistant" if m.get("role") == "assistant" else "user",
              "content": m.get("content") or ""} for m in messages if m.get("role") not in ("system", "developer")]
    body: dict[str, Any] = {"model": model, "input": items, "store": False, "stream": False,
                            "max_output_tokens": max(MIN_OUTPUT_TOKENS, max_output_tokens)}
    if system:
        body["instructions"] = "\n\n".join(str(s) for s in system)
    return body


def answer_text(raw: bytes, usage: dict[str, Any] | None = None) -> str:
    """The text of a Responses answer (its message items' output_text parts)."""
    try:
        data = orjson.loads(raw)
        output = data["output"]
        if not isinstance(output, list):
            raise TypeError
    except (orjson.JSONDecodeError, KeyError, TypeError):
        raise SummarizerError("invalid", "the upstream's answer is not a Responses response") from None
    u = data.get("usage")
    if usage is not None and isinstance(u, dict):
        # Both spellings: the bill and the metrics read the chat names.
        usage.update(u)
        usage.setdefault("prompt_tokens", u.get("input_tokens"))
        usage.setdefault("completion_tokens", u.get("output_tokens"))
    texts = []
    calls = False
    for item in output:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            for part in item.get("content") or []:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    texts.append(part["text"])
        elif item.get("type") in ("function_call", "custom_tool_call"):
            calls = True
    if not texts and calls:
        raise SummarizerError("invalid", "the answer is a tool call, not a summary", reason="tool_call")
    if not texts:
        raise SummarizerError("invalid", "the upstream's answer has no text")
    return "".join(texts)


@dataclass
class ResponsesCaller:
    session: aiohttp.ClientSession
    base_url: str
    connect_timeout_s: float

    async def complete(
        self,
        *,
        headers: dict[str, str],
        model: str,
        messages: list[dict[str, Any]],
        max_output_tokens: int,
        timeout_s: float,
        usage: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> str:
        # `extra` carries a chat conversation's tools for a call riding its cache: chat-shaped, so
        # not sent here (this call is always the transcript form).
        body = responses_body(model, messages, max_output_tokens)
        status, raw = await post_json(self.session, self.base_url + "/responses", headers, body, timeout_s,
                                      self.connect_timeout_s)
        if status == 200:
            return answer_text(raw, usage)
        if is_context_overflow(status, raw):
            raise SummarizerError("overflow", "the summarizer's input exceeded the upstream context window")
        raise SummarizerError("http", f"upstream answered HTTP {status}")
