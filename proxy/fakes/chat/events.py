"""A chat completion answer as OpenAI streams it: the `chat.completion.chunk` events of a reply
(text in pieces, tool calls opened and their arguments in fragments, the finish chunk, the usage
chunk when asked for, `[DONE]`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from proxy.fakes.common import split_args, split_text

SYSTEM_FINGERPRINT = "fp_fake0000"


@dataclass
class Reply:
    """One scripted answer, resolved: its text, its tool calls (OpenAI form) and why it ended."""

    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str


def sse_events(cid: str, created: int, model: str, reply: Reply, usage: dict | None) -> list[tuple[bytes, bool]]:
    """The stream of a reply as OpenAI sends it: (bytes of one `data:` event, is the finish chunk)."""
    base = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "service_tier": "default", "system_fingerprint": SYSTEM_FINGERPRINT}

    def event(obj: Any) -> bytes:
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    def chunk(delta: dict[str, Any], finish: str | None = None) -> tuple[bytes, bool]:
        obj = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        if usage is not None:
            obj["usage"] = None  # with include_usage every chunk carries "usage": null
        return event(obj), finish is not None

    out: list[tuple[bytes, bool]] = []
    pieces = split_text(reply.content) if reply.content else []
    calls = reply.tool_calls
    if calls and not pieces:  # a tool-call-only answer opens with the first call, content null
        first = {"role": "assistant", "content": None,
                 "tool_calls": [{"index": 0, "id": calls[0]["id"], "type": "function",
                                 "function": {"name": calls[0]["function"]["name"], "arguments": ""}}],
                 "refusal": None}
        out.append(chunk(first))
    else:
        out.append(chunk({"role": "assistant", "content": "", "refusal": None}))
    for p in pieces:
        out.append(chunk({"content": p}))
    for idx, tc in enumerate(calls):
        if idx > 0 or pieces:
            out.append(chunk({"tool_calls": [{"index": idx, "id": tc["id"], "type": "function",
                                              "function": {"name": tc["function"]["name"], "arguments": ""}}]}))
        for frag in split_args(tc["function"]["arguments"]):
            out.append(chunk({"tool_calls": [{"index": idx, "function": {"arguments": frag}}]}))
    out.append(chunk({}, reply.finish_reason))
    if usage is not None:
        out.append((event({**base, "choices": [], "usage": usage}), False))
    out.append((b"data: [DONE]\n\n", False))
    return out


def usage(prompt_tokens: int, completion_tokens: int, cached: int) -> dict[str, Any]:
    """The `usage` object of a chat completion, with OpenAI's detail fields."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                      "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
    }


def completion(cid: str, created: int, model: str, reply: Reply, usage: dict[str, Any]) -> dict[str, Any]:
    """A non-streaming `chat.completion` object as OpenAI sends it."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None, "annotations": []}
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    return {
        "id": cid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": reply.finish_reason}],
        "usage": usage,
        "service_tier": "default",
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }
