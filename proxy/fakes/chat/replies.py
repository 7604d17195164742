"""What the chat fake answers when a test scripts nothing: the default reply, a valid history
summary (every heading the proxy's prompt asks for) and a short tool-output summary, with the
helpers that read a chat body's text, and the shaping of a scripted answer into a Reply. The other protocols' fakes reuse them on a chat-shaped view
(proxy/fakes/chat_view.py).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Callable

import orjson

from proxy.fakes.chat.events import Reply
from proxy.fakes.common import rand
from proxy.fakes.summarizer_match import TOOL_OUTPUT_BEGIN, TOOL_OUTPUT_END


def content_text(content: Any) -> str:
    """The text of a message content: a string, or the text parts of a list joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def last_user_text(body: dict[str, Any]) -> str:
    for m in reversed(body.get("messages") or []):
        if isinstance(m, dict) and m.get("role") == "user":
            return content_text(m.get("content"))
    return ""


def default_reply(body: dict[str, Any]) -> str:
    """What the fake answers when `reply` is None: "ok: " + first 50 chars of the last user text."""
    return "ok: " + last_user_text(body)[:50]


_LABEL_RE = re.compile(r"\n\[(?:User|Assistant|System|Tool call|Tool result[^\]\n]*)\]:|</conversation>")


def _last_block(text: str, label: str) -> str | None:
    i = text.rfind(label)
    if i < 0:
        return None
    rest = text[i + len(label) :]
    m = _LABEL_RE.search(rest)
    return (rest[: m.start()] if m else rest).strip()


def default_history_summary(body: dict[str, Any]) -> str:
    """A valid history summary (every required heading), deterministic for the same input.

    The Critical Context line carries `fake-summary-<hash of the summarizer's user message>` so a
    test can tell which summary ended up in a forwarded request. About 200 tokens.
    """
    convo = last_user_text(body)
    digest = hashlib.sha256(convo.encode("utf-8")).hexdigest()[:12]
    task = _last_block(convo, "[User]:") or "(no user request found)"
    if len(task) > 300:
        task = task[:300] + " ..."
    update = "<previous-summary>" in convo
    return (
        "## Active Task\n"
        f"{task}\n\n"
        "## Goal\n"
        "Complete the user's request described in the conversation.\n\n"
        "## Constraints & Preferences\n"
        "- (none recorded)\n\n"
        "## Progress\n"
        "### Done\n"
        f"- [x] {'Updated the previous summary with newer messages' if update else 'Reviewed the earlier conversation'}\n\n"
        "### In Progress\n"
        "- [ ] Continue the active task\n\n"
        "### Blocked\n"
        "- (none)\n\n"
        "## Key Decisions\n"
        "- **Keep going**: the conversation so far is on track\n\n"
        "## Answered Questions\n"
        "- (none)\n\n"
        "## Next Steps\n"
        "1. Continue the active task\n\n"
        "## Critical Context\n"
        f"- fake-summary-{digest}\n"
    )


_TOOL_NAME_RES = (
    re.compile(r"\[Summary of ([\w.\-]+) output\]"),
    re.compile(r"(?im)^\W*tool(?:[ _-]?name)?\W*[:=]\s*[`'\"*]*([\w.\-]+)"),
    re.compile(r"<tool(?:_name)?>\s*([\w.\-]+)\s*</tool(?:_name)?>"),
    re.compile(r"(?i)\btool\s+[`'\"]([\w.\-]+)[`'\"]"),
)


def tool_output_payload(text: str) -> str | None:
    """The raw tool output between the BEGIN/END marker lines, or None."""
    i = text.find(TOOL_OUTPUT_BEGIN)
    j = text.rfind(TOOL_OUTPUT_END)
    if i < 0 or j < i:
        return None
    return text[i + len(TOOL_OUTPUT_BEGIN) : j].strip("\n")


def default_tool_summary(body: dict[str, Any]) -> str:
    """A short tool-result summary: `[Summary of <tool> output]`, `## Key facts`, `## Original size`.

    The tool name is guessed from the request ("Tool: name", "tool name: name", "<tool>name</tool>",
    "tool `name`"; else "tool"). About 60-90 tokens, so keep test payloads bigger than that.
    """
    text = "\n".join(content_text(m.get("content")) for m in body.get("messages") or [] if isinstance(m, dict))
    user = last_user_text(body)
    payload = tool_output_payload(user)
    if payload is None:
        payload = tool_output_payload(text) or ""
    outside = user.replace(payload, "") if payload else user
    name = "tool"
    for rx in _TOOL_NAME_RES:
        m = rx.search(outside)
        if m:
            name = m.group(1)
            break
    lines = payload.splitlines() or [""]
    first, last = lines[0].strip()[:80], lines[-1].strip()[:80]
    return (
        f"[Summary of {name} output]\n"
        f"Fake summary of a {len(lines)}-line tool output.\n\n"
        "## Key facts\n"
        f"- First line: {first}\n"
        f"- Last line: {last}\n\n"
        "## Original size\n"
        f"{len(payload)} characters, {len(lines)} lines\n"
    )


def _tool_call(tc: dict[str, Any]) -> dict[str, Any]:
    """A scripted tool call in OpenAI form (shorthand {"name", "arguments": str|dict} accepted, an id
    generated when missing)."""
    fn = tc.get("function") or {"name": tc.get("name"), "arguments": tc.get("arguments")}
    args = fn.get("arguments")
    if not isinstance(args, str):
        args = orjson.dumps(args if args is not None else {}).decode()
    return {"id": tc.get("id") or "call_" + rand(24), "type": "function",
            "function": {"name": fn["name"], "arguments": args}}


def shape_reply(result: Any, body: dict[str, Any], limit: int | None,
                truncate: Callable[[str, int], str], count: Callable[[str], int]) -> Reply:
    """A scripted answer (None: the default, str, or a dict assistant message) as a Reply, its text
    cut at `limit` tokens with finish_reason "length" as OpenAI does (no limit: not cut)."""
    if result is None:
        result = default_reply(body)
    if isinstance(result, str):
        content, raw_calls, finish = result, [], None
    elif isinstance(result, dict):
        content, raw_calls, finish = result.get("content"), result.get("tool_calls") or [], result.get("finish_reason")
    else:
        raise TypeError(f"scripted reply must be str, dict, FakeError or None, not {type(result).__name__}")
    calls = [_tool_call(tc) for tc in raw_calls]
    if limit and content and count(content) > limit:
        content, finish = truncate(content, limit), "length"
    return Reply(content, calls, finish or ("tool_calls" if calls else "stop"))
