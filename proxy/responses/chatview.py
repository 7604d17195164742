"""A Responses request as the chat messages the proxy's stages read, and the stages' result back
as Responses input (pure).

The stages (tool-result notes, history compaction) work on chat messages. Each chat message here
stands for a group of input items and names it (`GROUP_KEY`: a digest of the group's JSON, so the
same items make the same message, and the same store keys, on every request):

- message 0 carries `instructions` (empty when there are none): the system prompt, where the
  annotation goes;
- a system/developer message item is a system message; so is every item up to the last
  compaction item of a provider (OpenAI's, readable only by it): it stays, never summarized;
- a user message item is a user message (its content as sent);
- a run of model items (reasoning, assistant messages, calls, built-in tool items, anything
  unknown) is one assistant message: its text, a `tool_calls` entry per call. So a cut (before a
  user or an assistant message) never falls inside a step, between a reasoning item and what
  follows it, or between a call and its output;
- a call's output is a `tool` message with its text.

Back: message 0's content is `instructions`; an untouched message gives back its items as they
came; a rewritten one (a tool output made a note or clamped, a user message the summary was merged
into) gives back its item with the new text; a message the stages made (the summary) becomes a
user message item.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

from proxy import jsonbody
from proxy.responses import items as ri

GROUP_KEY = "x_responses_items"
MODEL_KINDS = (ri.ASSISTANT, ri.TOOL_CALL, ri.OPAQUE)


@dataclass
class ChatView:
    messages: list[dict[str, Any]]
    groups: dict[str, list[Any]]  # GROUP_KEY value -> the items it stands for
    had_instructions: bool

    def originals(self) -> set[int]:
        return {id(m) for m in self.messages}


def _key(group: list[Any]) -> str:
    return hashlib.sha256(jsonbody.dumps(group)).hexdigest()[:32]


def to_chat(body: dict[str, Any]) -> ChatView:
    items = ri.input_items(body)
    entries = ri.parse_items(items)
    instructions = body.get("instructions")
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions if isinstance(instructions, str) else ""}]
    groups: dict[str, list[Any]] = {}

    def add(msg: dict[str, Any], group: list[Any]) -> None:
        key = _key(group)
        groups.setdefault(key, group)
        msg[GROUP_KEY] = key
        messages.append(msg)

    last_foreign = max((e.index for e in entries if e.type == ri.COMPACTION), default=-1)
    i = 0
    while i < len(entries):
        e = entries[i]
        if e.index <= last_foreign or (e.kind == ri.SYSTEM and len(messages) == i + 1):
            # the leading system part, and everything up to a provider's compaction item
            add({"role": e.role if e.kind == ri.SYSTEM else "system", "content": _content(e)}, [e.raw])
            i += 1
        elif e.kind in (ri.SYSTEM, ri.USER):
            add({"role": "user" if e.kind == ri.USER else "system", "content": _content(e)}, [e.raw])
            i += 1
        elif e.kind == ri.TOOL_RESULT:
            msg = {"role": "tool", "tool_call_id": e.call_id or "", "content": e.text}
            if e.name:
                msg["name"] = e.name
            add(msg, [e.raw])
            i += 1
        else:
            j = i
            while j < len(entries) and entries[j].kind in MODEL_KINDS and entries[j].index > last_foreign:
                j += 1
            step = entries[i:j]
            texts = [s.text for s in step if s.kind == ri.ASSISTANT and s.text]
            # built-in tool items and unknown ones count and read as their JSON; reasoning does not
            texts += [f"[{s.type}] {s.text}" for s in step if s.kind == ri.OPAQUE and s.type != "reasoning" and s.text]
            msg: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
            calls = [{"id": s.call_id or "", "type": "function", "function": {
                "name": s.name or s.type, "arguments": _args(s)}} for s in step if s.kind == ri.TOOL_CALL]
            if calls:
                msg["tool_calls"] = calls
            add(msg, [s.raw for s in step])
            i = j
    return ChatView(messages, groups, isinstance(instructions, str))


def _content(e: ri.Entry) -> Any:
    content = e.raw.get("content") if isinstance(e.raw, dict) else None
    return content if isinstance(content, (str, list)) else e.text


def _args(e: ri.Entry) -> str:
    raw = e.raw
    for key in ("arguments", "input"):
        if isinstance(raw.get(key), str):
            return raw[key]
    return orjson.dumps(raw.get("action", raw.get("operation"))).decode()


class NotMapped(ValueError):
    """The stages returned a message this view cannot turn back into items."""


def from_chat(view: ChatView, messages: list[dict[str, Any]]) -> tuple[str | None, list[Any]]:
    """(instructions, input items) for the stages' messages."""
    if not messages or messages[0].get("role") != "system" or GROUP_KEY in messages[0]:
        raise NotMapped("the first message is not the instructions")
    instructions = _text(messages[0].get("content"))
    originals = view.originals()
    out: list[Any] = []
    for m in messages[1:]:
        key = m.get(GROUP_KEY)
        if key is None:
            if m.get("role") != "user":
                raise NotMapped(f"a {m.get('role')} message the stages made")
            out.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": _text(m.get("content"))}]})
            continue
        group = view.groups.get(key)
        if group is None:
            raise NotMapped("a message naming no items")
        if id(m) in originals or m.get("role") in ("system", "assistant"):
            out.extend(group)
        elif m.get("role") == "tool":
            item = dict(group[0])
            item["output"] = _text(m.get("content"))
            out.append(item)
        elif m.get("role") == "user":
            item = dict(group[0])
            item["content"] = _input_parts(m.get("content"))
            out.append(item)
        else:
            raise NotMapped(f"a rewritten {m.get('role')} message")
    return (instructions if instructions or view.had_instructions else None), out


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _input_parts(content: Any) -> Any:
    """Chat content the stages wrote (a merged summary: text parts, or one string) as Responses
    input content; parts that came from the client stay as they were."""
    if isinstance(content, list):
        return [{"type": "input_text", "text": p["text"]} if isinstance(p, dict) and p.get("type") == "text" else p
                for p in content]
    return content


def render(body: dict[str, Any], instructions: str | None, items: list[Any]) -> bytes:
    out = dict(body)
    out["input"] = items
    if instructions is not None:
        out["instructions"] = instructions
    return jsonbody.dumps(out)
