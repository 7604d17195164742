"""What the Responses fake sends back: output items made from a scripted reply, the response
object, and the stream of events in OpenAI's exact format (`event:` name, JSON with `type` and
`sequence_number`; no `[DONE]`). Field lists follow openai/types/responses/response.py and the
response_*_event.py types."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.fakes.common import rand, split_args, split_text


@dataclass
class Reply:
    """A scripted answer, normalized: optional reasoning summary, text, calls."""

    text: str | None = None
    reasoning: str | None = None
    function_calls: list[dict[str, Any]] = field(default_factory=list)  # {"name", "arguments": str, "call_id"}
    custom_calls: list[dict[str, Any]] = field(default_factory=list)  # {"name", "input": str, "call_id"}


def normalize_reply(result: Any) -> Reply:
    """str | {"content"/"text", "reasoning", "tool_calls" (chat form or {"name", "arguments"}),
    "custom_tool_calls": [{"name", "input"}]}."""
    if isinstance(result, str):
        return Reply(text=result)
    if not isinstance(result, dict):
        raise TypeError(f"scripted reply must be str, dict, FakeError or None, not {type(result).__name__}")
    calls = []
    for tc in result.get("tool_calls") or []:
        fn = tc.get("function") or tc
        args = fn.get("arguments")
        if not isinstance(args, str):
            args = orjson.dumps(args if args is not None else {}).decode()
        calls.append({"name": fn["name"], "arguments": args, "call_id": tc.get("call_id") or tc.get("id")
                      or "call_" + rand(24)})
    customs = [{"name": c["name"], "input": c.get("input", ""), "call_id": c.get("call_id") or "call_" + rand(24)}
               for c in result.get("custom_tool_calls") or []]
    text = result.get("content", result.get("text"))
    return Reply(text=text, reasoning=result.get("reasoning"), function_calls=calls, custom_calls=customs)


def output_items(reply: Reply, reasoning_token) -> list[dict[str, Any]]:
    """The output items, reasoning first. `reasoning_token(rs_id, following_item)` gives its
    encrypted_content (or None when the request did not include it)."""
    items: list[dict[str, Any]] = []
    for c in reply.function_calls:
        items.append({"id": "fc_" + rand(24), "type": "function_call", "status": "completed",
                      "arguments": c["arguments"], "call_id": c["call_id"], "name": c["name"]})
    for c in reply.custom_calls:
        items.append({"id": "ctc_" + rand(24), "type": "custom_tool_call", "status": "completed",
                      "call_id": c["call_id"], "input": c["input"], "name": c["name"]})
    if reply.text is not None or not items:
        msg = {"id": "msg_" + rand(24), "type": "message", "status": "completed", "role": "assistant",
               "content": [{"type": "output_text", "text": reply.text or "", "annotations": [], "logprobs": []}]}
        items.insert(0, msg)
    if reply.reasoning is not None:
        rid = "rs_" + rand(24)
        items.insert(0, {"id": rid, "type": "reasoning",
                         "summary": [{"type": "summary_text", "text": reply.reasoning}],
                         "encrypted_content": reasoning_token(rid, items[0])})
    return items


def response_object(rid: str, body: dict[str, Any], status: str, output: list[Any], usage: Any,
                    *, error: Any = None, incomplete: Any = None, created_at: int | None = None) -> dict[str, Any]:
    return {
        "id": rid, "object": "response", "created_at": created_at or int(time.time()), "status": status,
        "background": False, "error": error, "incomplete_details": incomplete,
        "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": body.get("max_tool_calls"), "model": body.get("model"), "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
        "service_tier": "default", "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": body.get("text") or {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0), "truncation": body.get("truncation") or "disabled",
        "usage": usage, "user": body.get("user"), "metadata": body.get("metadata") or {},
    }


def usage(input_tokens: int, cached: int, output_tokens: int, reasoning_tokens: int = 0) -> dict[str, Any]:
    return {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": input_tokens + output_tokens}


def stream_events(final: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of a finished response, as OpenAI streams it (without sequence numbers)."""
    start = {**final, "status": "in_progress", "output": [], "usage": None, "error": None, "incomplete_details": None}
    ev: list[dict[str, Any]] = [{"type": "response.created", "response": start},
                                {"type": "response.in_progress", "response": start}]
    for idx, item in enumerate(final["output"]):
        iid, t = item["id"], item["type"]
        if t == "message":
            ev.append({"type": "response.output_item.added", "output_index": idx,
                       "item": {**item, "status": "in_progress", "content": []}})
            for ci, part in enumerate(item["content"]):
                ev.append({"type": "response.content_part.added", "item_id": iid, "output_index": idx,
                           "content_index": ci, "part": {**part, "text": ""}})
                for piece in split_text(part["text"]):
                    ev.append({"type": "response.output_text.delta", "item_id": iid, "output_index": idx,
                               "content_index": ci, "delta": piece, "logprobs": []})
                ev.append({"type": "response.output_text.done", "item_id": iid, "output_index": idx,
                           "content_index": ci, "text": part["text"], "logprobs": []})
                ev.append({"type": "response.content_part.done", "item_id": iid, "output_index": idx,
                           "content_index": ci, "part": part})
        elif t == "function_call":
            ev.append({"type": "response.output_item.added", "output_index": idx,
                       "item": {**item, "status": "in_progress", "arguments": ""}})
            for frag in split_args(item["arguments"]):
                ev.append({"type": "response.function_call_arguments.delta", "item_id": iid, "output_index": idx,
                           "delta": frag})
            ev.append({"type": "response.function_call_arguments.done", "item_id": iid, "output_index": idx,
                       "name": item["name"], "arguments": item["arguments"]})
        elif t == "custom_tool_call":
            ev.append({"type": "response.output_item.added", "output_index": idx, "item": {**item, "input": ""}})
            for frag in split_args(item["input"]):
                ev.append({"type": "response.custom_tool_call_input.delta", "item_id": iid, "output_index": idx,
                           "delta": frag})
            ev.append({"type": "response.custom_tool_call_input.done", "item_id": iid, "output_index": idx,
                       "input": item["input"]})
        else:  # reasoning (its summary comes with .done), compaction (whole)
            added = {**item, "summary": []} if t == "reasoning" else item
            ev.append({"type": "response.output_item.added", "output_index": idx, "item": added})
        ev.append({"type": "response.output_item.done", "output_index": idx, "item": item})
    end = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(final["status"],
                                                                                      "response.failed")
    ev.append({"type": end, "response": final})
    return ev


def failed_events(final: dict[str, Any]) -> list[dict[str, Any]]:
    """A response that failed before any output (e.g. context_length_exceeded)."""
    start = {**final, "status": "in_progress", "error": None, "usage": None}
    return [{"type": "response.created", "response": start}, {"type": "response.in_progress", "response": start},
            {"type": "response.failed", "response": final}]


def numbered(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`sequence_number` on each event, from 0, as the second key after `type`."""
    return [{"type": e["type"], "sequence_number": i, **{k: v for k, v in e.items() if k != "type"}}
            for i, e in enumerate(events)]


def sse(event: dict[str, Any]) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
