"""What the Messages fake needs to know about a request's content: the blocks in cache order
(tools, system, messages), their token counts, and the chat-shaped view."""

from __future__ import annotations

from typing import Any, Callable

import orjson

from proxy.fakes.chat_view import chat_view

IMAGE_TOKENS = 1600  # Anthropic: about (width x height) / 750; a ~1100x1100 image
MESSAGE_OVERHEAD = 3


def content_blocks(content: Any) -> list[Any]:
    """A message's content as blocks: a string is one text block."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def system_blocks(body: dict[str, Any]) -> list[Any]:
    return content_blocks(body.get("system")) if body.get("system") is not None else []


def block_text(block: Any) -> str:
    if not isinstance(block, dict):
        return ""
    t = block.get("type")
    if t == "text":
        return str(block.get("text", ""))
    if t == "thinking":
        return str(block.get("thinking", ""))
    if t == "tool_use" or t == "server_tool_use":
        return f"{block.get('name', '')}({orjson.dumps(block.get('input', {})).decode()})"
    if t == "tool_result":
        return "".join(block_text(b) for b in content_blocks(block.get("content")))
    return ""


def block_tokens(block: Any, count: Callable[[str], int]) -> int:
    if not isinstance(block, dict):
        return 0
    t = block.get("type")
    if t in ("text", "thinking", "tool_use", "server_tool_use"):
        return count(block_text(block)) + (3 if t != "text" else 0)
    if t == "tool_result":
        return 3 + sum(block_tokens(b, count) for b in content_blocks(block.get("content")))
    if t == "image":
        return IMAGE_TOKENS
    if t == "redacted_thinking":
        return count(str(block.get("data", ""))) // 4  # opaque; what it stands for, roughly
    return count(orjson.dumps({k: v for k, v in block.items() if k != "cache_control"}).decode())


def cache_segments(body: dict[str, Any]) -> list[Any]:
    """Everything the prompt cache sees, in its order: each tool, each system block, then each
    message's blocks (a message boundary is marked by its role)."""
    out: list[Any] = [("tool", t) for t in body.get("tools") or []]
    out += [("system", b) for b in system_blocks(body)]
    for m in body.get("messages") or []:
        if not isinstance(m, dict):
            continue
        for j, b in enumerate(content_blocks(m.get("content"))):
            out.append((m.get("role") if j == 0 else "", b))
    return out


def has_breakpoint(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("cache_control") is not None


def view(body: dict[str, Any]) -> dict[str, Any]:
    """The chat-shaped view: system as the system prompt, each message's text (tool uses as
    assistant text, tool results as user text)."""
    system = "\n\n".join(block_text(b) for b in system_blocks(body)) or None
    turns = []
    for m in body.get("messages") or []:
        if isinstance(m, dict) and m.get("role") in ("user", "assistant"):
            turns.append((m["role"], "\n".join(block_text(b) for b in content_blocks(m.get("content"))
                                              if not (isinstance(b, dict) and b.get("type") == "thinking"))))
    names = [str(t.get("name")) for t in body.get("tools") or [] if isinstance(t, dict) and t.get("name")]
    v = chat_view(body.get("model"), system, turns, names, body)
    v["calls"] = calls_view(body)
    return v


def calls_view(body: dict[str, Any]) -> dict[str, Any]:
    """The request as a Chat Completions body, calls and results kept apart (tool_use blocks as an
    assistant message's tool_calls, tool_result blocks as `tool` messages, `tool_choice` as chat
    says it): a reply written for the chat fake reads a Messages request through it unchanged."""
    messages: list[dict[str, Any]] = []
    system = "\n\n".join(block_text(b) for b in system_blocks(body))
    if system:
        messages.append({"role": "system", "content": system})
    for m in body.get("messages") or []:
        if not isinstance(m, dict):
            continue
        blocks = content_blocks(m.get("content"))
        results = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
        for b in results:
            messages.append({"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": block_text(b)})
        uses = [{"id": b.get("id"), "type": "function",
                 "function": {"name": b.get("name"), "arguments": orjson.dumps(b.get("input", {})).decode()}}
                for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]
        text = "\n".join(block_text(b) for b in blocks if isinstance(b, dict) and b.get("type") == "text")
        if text or (not uses and not results):
            msg: dict[str, Any] = {"role": m.get("role"), "content": text}
            messages.append(msg)
        if uses:
            if messages and messages[-1]["role"] == "assistant" and "tool_calls" not in messages[-1]:
                messages[-1]["tool_calls"] = uses
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": uses})
    tools = [{"type": "function", "function": {"name": t.get("name")}} for t in body.get("tools") or []
             if isinstance(t, dict) and t.get("name")]
    out: dict[str, Any] = {"model": body.get("model"), "messages": messages, "tools": tools}
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        out["tool_choice"] = {"none": "none", "auto": "auto"}.get(choice.get("type"), "required")
    return out
