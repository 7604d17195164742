"""Where a Messages history may be cut and how the kept part is put back together (design.md § Messages API),
as pure functions over the request's `messages`.

A turn is a message: its blocks (text, tool_use, thinking ...) stay together, so cuts fall between
messages. Consecutive messages of one role are one turn to the API (it merges them), so a cut falls
only where the role changes. A user turn that carries tool_result blocks answers the assistant turn
before it: no cut right before it, so every kept result keeps its call, and the assistant turn whose
calls the kept part answers is kept whole with its signed thinking (which the proxy never edits).
The forwarded history starts with the summary as a user message; when the first kept message is a
user message the summary merges into it as its first block, so roles still alternate.
"""

from __future__ import annotations

from typing import Any

from proxy.protocols.messages.body import blocks

SUMMARY_CACHE = {"type": "ephemeral"}


def _types(msg: dict[str, Any]) -> list[str]:
    return [b.get("type") for b in blocks(msg.get("content")) if isinstance(b, dict)]


def cut_allowed(messages: list[dict[str, Any]]) -> list[bool]:
    """For each index i: may messages[:i] be summarized and messages[i:] kept?"""
    return [cut_allowed_at(messages, i) for i in range(len(messages))]


def cut_allowed_at(messages: list[dict[str, Any]], i: int) -> bool:
    """cut_allowed's answer for index i (it reads messages i-1 and i only)."""
    if i == 0:
        return False
    role = messages[i].get("role")
    if role == messages[i - 1].get("role"):
        return False  # inside one API turn
    return role == "assistant" or "tool_result" not in _types(messages[i])


def native_compaction(body: dict[str, Any], start: int = 0) -> str | None:
    """Why the client's own (Anthropic's) compaction covers this request, or None (design.md § Messages API):
    `context_management` with an edit that clears or compacts history (tool-result clearing, the
    compact edit, or one this code does not know), or `compaction` blocks in the history (from
    message `start` on: those before are known to carry none). The proxy then does not compact
    the history; tool notes still apply."""
    if _edits_history(body.get("context_management")):
        return "the request asks for Anthropic's context management"
    messages = body.get("messages") or ()
    for i in range(start, len(messages)):
        m = messages[i]
        # Only a list of blocks can hold one (a string is one text block): no block list is built.
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "compaction" for b in content):
            return "the history carries Anthropic compaction blocks"
    return None


THINKING_EDIT = "clear_thinking_"  # clear_thinking_20251015, and its later versions


def _edits_history(cm: Any) -> bool:
    """Whether `context_management` asks the API to clear or compact history. Thinking-block
    clearing alone does not: it touches no span the proxy summarizes (thinking never reaches the
    summarizer), and Claude Code sends it, with keep "all", on every request."""
    if cm is None:
        return False
    edits = cm.get("edits") if isinstance(cm, dict) else None
    if not isinstance(edits, list):
        return True  # a shape this code does not know (the API judges it): step aside
    return any(not (isinstance(e, dict) and isinstance(e.get("type"), str) and e["type"].startswith(THINKING_EDIT))
               for e in edits)


def summary_block(text: str, cache_control: dict[str, Any] | None = SUMMARY_CACHE) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": text}
    if cache_control is not None:
        block["cache_control"] = cache_control
    return block


def with_summary(kept: list[dict[str, Any]], block: dict[str, Any]) -> list[dict[str, Any]]:
    """The forwarded history: the summary block first, merged into the first kept message when
    that is a user message (a new, copied message; the others are the client's own objects)."""
    if kept and kept[0].get("role") == "user":
        first = kept[0]
        content = first.get("content")
        rest = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
        return [{**first, "content": [block, *rest]}, *kept[1:]]
    return [{"role": "user", "content": [block]}, *kept]


def with_annotation(system: Any, text: str) -> str | list[dict[str, Any]]:
    """`system` with the proxy's annotation at its end: blocks get one more text block (the
    client's keep their bytes and breakpoints); a string system, or none, stays a string (servers
    that bridge Messages to chat, LiteLLM, pass blocks on as a list the chat template may reject)."""
    if system is None or isinstance(system, str):
        return f"{system}\n\n{text}" if system else text
    return [*system, {"type": "text", "text": text}]


def with_note(block: dict[str, Any], note: str) -> dict[str, Any]:
    """A tool_result whose content is replaced by the proxy's note: id, is_error and the client's
    breakpoint kept."""
    return {**block, "content": [{"type": "text", "text": note}]}
