"""What the Messages fake sends back: the message object and the SSE stream in Anthropic's format
(`event:` names message_start, content_block_start / _delta / _stop, ping, message_delta,
message_stop; `error` for a failure mid-stream). Field lists follow anthropic/types/message.py
and raw_*_event.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.fakes.common import rand, split_args, split_text


@dataclass
class Reply:
    text: str | None = None
    thinking: str | None = None
    redacted: bool = False  # answer with a redacted_thinking block instead of readable thinking
    tool_uses: list[dict[str, Any]] = field(default_factory=list)  # {"name", "input": dict}


def normalize_reply(result: Any) -> Reply:
    """str | {"content"/"text", "thinking", "redacted_thinking": bool, "tool_calls"/"tool_uses":
    [{"name", "input" or "arguments" (dict or JSON string)}]}."""
    if isinstance(result, str):
        return Reply(text=result)
    if not isinstance(result, dict):
        raise TypeError(f"scripted reply must be str, dict, FakeError or None, not {type(result).__name__}")
    uses = []
    for tc in (result.get("tool_uses") or []) + (result.get("tool_calls") or []):
        fn = tc.get("function") or tc
        args = fn.get("input", fn.get("arguments"))
        if isinstance(args, str):
            args = orjson.loads(args) if args else {}
        uses.append({"name": fn["name"], "input": args or {}, "id": tc.get("id") or "toolu_01" + rand(22)})
    return Reply(text=result.get("content", result.get("text")), thinking=result.get("thinking"),
                 redacted=bool(result.get("redacted_thinking")), tool_uses=uses)


def content(reply: Reply, thinking_on: bool, sign_thinking, sign_redacted) -> list[dict[str, Any]]:
    """`sign_thinking(text)` and `sign_redacted()` sign the reply's thinking (bound to the request
    when the model binds its blocks: the caller's closures know the request)."""
    out: list[dict[str, Any]] = []
    if thinking_on:
        if reply.redacted:
            out.append({"type": "redacted_thinking", "data": sign_redacted()})
        else:
            text = reply.thinking if reply.thinking is not None else "Let me think about this."
            out.append({"type": "thinking", "thinking": text, "signature": sign_thinking(text)})
    if reply.text is not None or not reply.tool_uses:
        out.append({"type": "text", "text": reply.text or ""})
    for u in reply.tool_uses:
        out.append({"type": "tool_use", "id": u["id"], "name": u["name"], "input": u["input"]})
    return out


def message_object(mid: str, model: str, blocks: list[Any], stop_reason: str | None,
                   usage: dict[str, Any]) -> dict[str, Any]:
    return {"id": mid, "type": "message", "role": "assistant", "model": model, "content": blocks,
            "stop_reason": stop_reason, "stop_sequence": None, "usage": usage}


def stream_events(final: dict[str, Any]) -> list[dict[str, Any]]:
    usage = final["usage"]
    start = {**final, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    ev: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for i, b in enumerate(final["content"]):
        t = b["type"]
        if t == "text":
            ev.append({"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}})
            for piece in split_text(b["text"]):
                ev.append({"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": piece}})
        elif t == "thinking":
            ev.append({"type": "content_block_start", "index": i,
                       "content_block": {"type": "thinking", "thinking": "", "signature": ""}})
            for piece in split_text(b["thinking"]):
                ev.append({"type": "content_block_delta", "index": i,
                           "delta": {"type": "thinking_delta", "thinking": piece}})
            ev.append({"type": "content_block_delta", "index": i,
                       "delta": {"type": "signature_delta", "signature": b["signature"]}})
        elif t == "tool_use":
            ev.append({"type": "content_block_start", "index": i,
                       "content_block": {"type": "tool_use", "id": b["id"], "name": b["name"], "input": {}}})
            for frag in split_args(orjson.dumps(b["input"]).decode()):
                ev.append({"type": "content_block_delta", "index": i,
                           "delta": {"type": "input_json_delta", "partial_json": frag}})
        elif t == "compaction":  # the signature with the start, the summary in one delta
            ev.append({"type": "content_block_start", "index": i,
                       "content_block": {"type": "compaction", "content": None, "signature": b.get("signature")}})
            ev.append({"type": "content_block_delta", "index": i,
                       "delta": {"type": "compaction_delta", "content": b["content"]}})
        else:  # redacted_thinking arrives whole
            ev.append({"type": "content_block_start", "index": i, "content_block": b})
        if i == 0:
            ev.insert(2, {"type": "ping"})  # right after the first content_block_start, as the API sends it
        ev.append({"type": "content_block_stop", "index": i})
    ev.append({"type": "message_delta", "delta": {"stop_reason": final["stop_reason"], "stop_sequence": None},
               "usage": {"output_tokens": usage["output_tokens"]}})
    ev.append({"type": "message_stop"})
    return ev


def sse(event: dict[str, Any]) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
