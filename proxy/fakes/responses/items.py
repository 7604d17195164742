"""What the Responses fake needs to know about input items: their text, their token count, and
the chat-shaped view of a request (for scripted answers and summarizer recognition)."""

from __future__ import annotations

from typing import Any, Callable

import orjson

from proxy.fakes.chat_view import chat_view

IMAGE_TOKENS = 765  # fixed estimate per image part (a 512x512 high-detail image)
ITEM_OVERHEAD = 4  # per item, like the ~3-4 tokens per chat message

# Output items a model makes (what a reasoning item may precede).
MODEL_ITEM_TYPES = ("function_call", "custom_tool_call", "web_search_call", "file_search_call", "computer_call",
                    "local_shell_call", "shell_call", "apply_patch_call", "mcp_call", "mcp_list_tools",
                    "mcp_approval_request", "image_generation_call", "code_interpreter_call", "tool_search_call")


def input_items(body: dict[str, Any]) -> list[Any]:
    """`input` as items: a string is one user message."""
    inp = body.get("input")
    if isinstance(inp, str):
        return [{"type": "message", "role": "user", "content": inp}]
    return list(inp) if isinstance(inp, list) else []


def item_type(item: Any) -> str | None:
    """An item's type; a message may leave it out (EasyInputMessage)."""
    if not isinstance(item, dict):
        return None
    t = item.get("type")
    if t is None and "role" in item:
        return "message"
    return t if isinstance(t, str) else None


def parts_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for p in content:
            if isinstance(p, dict):
                for key in ("text", "refusal"):
                    if isinstance(p.get(key), str):
                        out.append(p[key])
        return "".join(out)
    return ""


def output_text(output: Any) -> str:
    """A tool output: a string or content parts."""
    return output if isinstance(output, str) else parts_text(output)


def item_text(item: Any) -> str:
    t = item_type(item)
    if t == "message":
        return parts_text(item.get("content"))
    if t in ("function_call_output", "custom_tool_call_output", "local_shell_call_output"):
        return output_text(item.get("output"))
    if t == "function_call":
        return f"{item.get('name', '')}({item.get('arguments', '')})"
    if t == "custom_tool_call":
        return f"{item.get('name', '')}({item.get('input', '')})"
    if t == "reasoning":
        return "".join(s.get("text", "") for s in item.get("summary") or [] if isinstance(s, dict))
    return ""


def item_tokens(item: Any, count: Callable[[str], int], compaction_tokens: Callable[[Any], int]) -> int:
    t = item_type(item)
    if t == "message":
        n = ITEM_OVERHEAD + count(str(item.get("role", "")))
        content = item.get("content")
        if isinstance(content, str):
            return n + count(content)
        for p in content or []:
            if not isinstance(p, dict):
                continue
            if p.get("type") == "input_image":
                n += IMAGE_TOKENS
            elif isinstance(p.get("text"), str) or isinstance(p.get("refusal"), str):
                n += count(p.get("text") if isinstance(p.get("text"), str) else p["refusal"])
            else:
                n += count(orjson.dumps(p).decode())
        return n
    if t == "compaction":
        return ITEM_OVERHEAD + compaction_tokens(item)
    if t in ("function_call", "custom_tool_call", "function_call_output", "custom_tool_call_output", "reasoning",
             "local_shell_call_output"):
        return ITEM_OVERHEAD + count(item_text(item))
    return ITEM_OVERHEAD + count(orjson.dumps(item).decode())  # built-in tool items and the rest


def view(body: dict[str, Any], items: list[Any]) -> dict[str, Any]:
    """The chat-shaped view: instructions (or leading system/developer items) as the system
    prompt, messages as turns, tool calls as assistant text, tool outputs as user text."""
    system_parts = [body["instructions"]] if isinstance(body.get("instructions"), str) else []
    turns: list[tuple[str, str]] = []
    leading = True
    for item in items:
        t = item_type(item)
        if t == "message" and item.get("role") in ("system", "developer"):
            if leading:
                system_parts.append(parts_text(item.get("content")))
                continue
            turns.append(("user", parts_text(item.get("content"))))
            continue
        leading = False
        if t == "message":
            turns.append(("assistant" if item.get("role") == "assistant" else "user", parts_text(item.get("content"))))
        elif t in ("function_call", "custom_tool_call"):
            turns.append(("assistant", item_text(item)))
        elif t in ("function_call_output", "custom_tool_call_output", "local_shell_call_output"):
            turns.append(("user", item_text(item)))
    names = [str(tool.get("name")) for tool in body.get("tools") or []
             if isinstance(tool, dict) and tool.get("type") in ("function", "custom") and tool.get("name")]
    v = chat_view(body.get("model"), "\n\n".join(p for p in system_parts if p) or None, turns, names, body)
    v["calls"] = calls_view(body, items)
    return v


def calls_view(body: dict[str, Any], items: list[Any]) -> dict[str, Any]:
    """The request as a Chat Completions body, calls and outputs kept apart (function calls as an
    assistant message's tool_calls, their outputs as `tool` messages, `tool_choice` as chat says
    it): a reply written for the chat fake reads a Responses request through it unchanged."""
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    for item in items:
        t = item_type(item)
        if t == "message":
            role = item.get("role")
            messages.append({"role": "system" if role == "developer" else role, "content": parts_text(item.get("content"))})
        elif t in ("function_call", "custom_tool_call"):
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", item.get("input", ""))}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif t in ("function_call_output", "custom_tool_call_output"):
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": item_text(item)})
    tools = [{"type": "function", "function": {"name": t.get("name")}} for t in body.get("tools") or []
             if isinstance(t, dict) and t.get("type") in ("function", "custom")]
    out: dict[str, Any] = {"model": body.get("model"), "messages": messages, "tools": tools}
    if body.get("tool_choice") is not None:
        out["tool_choice"] = body["tool_choice"] if isinstance(body["tool_choice"], str) else "required"
    return out
