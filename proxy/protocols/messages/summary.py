"""The proxy's own summarizer calls as Messages calls, and their answers read (pure).

Transcript form: the instructions as `system`, the prompt as the one user message. The form that
rides the conversation's cache (design.md § The summary call rides the cache) repeats the forwarded request's system, tools, thinking
setting (changing it would invalidate the cached messages) and messages as they were, up to where
the last request ended (`riding_end`), then asks in one more user message (merged into the last
one when that is a user message: roles alternate). Anthropic reads its cache only at a
breakpoint, so the last block of the repeated prefix carries one; the others stay as forwarded,
never more than 4 in all (breakpoints.fit). `tool_choice: none` keeps the model from calling the
declared tools.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.adapter import repeated_fields
from proxy.protocols.messages import breakpoints
from proxy.protocols.messages.body import blocks
from proxy.upstream import SummarizerError

DEFAULT_VERSION = "2023-06-01"  # anthropic-version when the client sent none (it is required)
UNMARKABLE = ("thinking", "redacted_thinking")  # the API refuses a cache_control on these


def riding_end(values: list[Any], first_kept: int, marks_newest: bool = False) -> int:
    """Anthropic reads its cache only at a breakpoint. When the client marks its conversation (a
    breakpoint after the part to summarize, or `marks_newest`: the top-level `cache_control`), the
    last request had its own at its end (Claude Code marks the newest message): so the call repeats
    the conversation up to there, the newest user turn left out, and the assistant turn before it
    too when that called tools (a call must be answered in the very next message). When it marks
    none there, nothing after the part to summarize was written to the cache: the call repeats that
    part only (more would be input billed in full). Never less than the part to summarize."""
    if not marks_newest and not breakpoints.slots({"messages": values[first_kept:]}):
        return first_kept
    end = len(values)
    while end > first_kept and values[end - 1].get("role") == "user":
        end -= 1
    if end > first_kept and any(isinstance(b, dict) and b.get("type") in ("tool_use", "server_tool_use")
                                for b in blocks(values[end - 1].get("content"))):
        end -= 1
    return max(end, first_kept)


def summary_body(model: str, prompt: str, output_cap: int, system: str = "", prefix: list[Any] | None = None,
                 tools: Any = None, request_body: Any = None) -> dict[str, Any]:
    if prefix is None:
        return {"model": model, "max_tokens": output_cap, "system": system,
                "messages": [{"role": "user", "content": prompt}], "stream": False}
    values = list(prefix)
    head = values.pop(0)["system"] if values and "role" not in values[0] else None
    messages, mark = _marked_end(values)
    ask = {"type": "text", "text": prompt}
    if messages and messages[-1].get("role") == "user":
        last = messages[-1]
        messages[-1] = {**last, "content": [*blocks(last.get("content")), ask]}
    else:
        messages.append({"role": "user", "content": [ask]})
    body: dict[str, Any] = {"model": model, "max_tokens": output_cap}
    if head is not None:
        body["system"] = head
    body["messages"] = messages
    if tools:
        body.update(tools=tools, tool_choice={"type": "none"})
    thinking = request_body.get("thinking") if isinstance(request_body, dict) else None
    if isinstance(thinking, dict):
        body["thinking"] = thinking
        if isinstance(thinking.get("budget_tokens"), int):
            body["max_tokens"] = output_cap + thinking["budget_tokens"]  # max_tokens counts the thinking too
    # (only thinking clearing, when the proxy compacts: native_compaction) The server edits the
    # prefix as it edited the client's, so the cached prefix is the one the call reads.
    body.update(repeated_fields(request_body, ("context_management",)))
    body["stream"] = False
    body, _ = breakpoints.fit(body, mark)
    return body


def _marked_end(messages: list[Any]) -> tuple[list[Any], tuple[Any, ...] | None]:
    """The messages with a breakpoint on the last block that may carry one (copied: the client's
    objects stay as they are), and its path; unchanged when it has one already."""
    for i in range(len(messages) - 1, -1, -1):
        content = list(blocks(messages[i].get("content")))
        for j in range(len(content) - 1, -1, -1):
            b = content[j]
            if not isinstance(b, dict) or b.get("type") in UNMARKABLE:
                continue
            if b.get("cache_control") is None:
                content[j] = {**b, "cache_control": {"type": "ephemeral"}}
                messages = [*messages[:i], {**messages[i], "content": content}, *messages[i + 1:]]
            return messages, ("messages", i, j)
    return messages, None


def usage_in_chat_names(usage: Any) -> dict[str, Any]:
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
            usage.update(usage_in_chat_names(data.get("usage")))
    except (orjson.JSONDecodeError, KeyError, TypeError):
        raise SummarizerError("invalid", "the upstream's answer is not a Messages response") from None
    if not isinstance(content, list):
        raise SummarizerError("invalid", "the upstream's answer has no content blocks")
    if any(isinstance(b, dict) and b.get("type") == "tool_use" for b in content):
        raise SummarizerError("invalid", "the answer is a tool call, not a summary", reason="tool_call")
    return "".join(b["text"] for b in content if isinstance(b, dict) and b.get("type") == "text"
                   and isinstance(b.get("text"), str))
