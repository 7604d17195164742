"""A Messages request as the chat messages the proxy's stages read today, and their result back
as Messages envelopes (pure). The stages (tool-result notes, masking, history summaries) work on
chat messages until the core runs them on the neutral model; this view lets the Messages route
use them now, with every Messages rule kept by the adapter on the way back.

Each chat message stands for part of a Messages envelope and names it (`GROUP_KEY`: the
envelope's stable digest, its position and the part's number: a history only grows at its end, so
the same messages give the same store keys on every request):
- message 0 is the system prompt as text parts (empty when there is none): the annotation the
  stages append to it becomes one more text block at the end of `system`;
- an assistant message is one assistant chat message: its text blocks, a `tool_calls` entry per
  tool_use (thinking and other opaque blocks are not shown, but counted);
- a user message gives a `tool` message per tool_result block, then one user message with its
  other blocks (when it has any).
Counts are the Messages counts of the blocks each part stands for (thinking included), not a chat
template's, so the stages' thresholds hold for this protocol.

Back: an envelope whose parts all came back untouched is the client's envelope itself (its bytes
go upstream); a tool message with new text is its tool_result with the note (`with_note`: id and
is_error kept); a summary (a user message the stages made, or a text part they put first in a
kept user part) becomes the summary block, with its cache breakpoint, at the start of the first
kept message (turns.with_summary); parts the stages cut away are dropped with their blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proxy.adapters.messages.count import count_block
from proxy.adapters.messages.turns import summary_block, with_annotation, with_note, with_summary
from proxy.adapters.messages import breakpoints
from proxy.adapters.base import Request
from proxy.model import Conversation, Envelope, Kind
from proxy.hashing import message_digest
from proxy.tokens import MESSAGE_OVERHEAD, TokenCounter

GROUP_KEY = "x_messages_part"


class NotMapped(ValueError):
    """The stages returned messages this view cannot turn back into a Messages request."""


@dataclass
class Part:
    env: int  # index of the envelope in the request's conversation
    blocks: list[int]  # its blocks this part stands for
    role: str  # assistant | tool | user
    message: dict[str, Any]  # the chat message as made here (identity tells an untouched one)


@dataclass
class ChatView:
    messages: list[dict[str, Any]]
    tokens: list[int]
    parts: dict[str, Part] = field(default_factory=dict)
    system_parts: int = 0  # text parts of message 0 as made here


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def to_chat(request: Request, counter: TokenCounter) -> ChatView:
    conv = request.conversation
    enc = request.encoding
    # Keys without the client's cache breakpoints: Claude Code moves them to the newest messages
    # on every request, and a marker is not content (the upstream's cache ignores it too).
    digests = [message_digest(_unmarked(e.value)) for e in conv.envelopes]
    envs = conv.envelopes
    start = conv.n_system
    sys_parts = [_text_part(envs[0].text)] if start else []
    view = ChatView([{"role": "system", "content": sys_parts}], [conv.tokens[0] if start else 0],
                    system_parts=len(sys_parts))

    def add(i: int, j: int, blocks: list[int], role: str, msg: dict[str, Any], first: bool) -> None:
        key = f"{digests[i].hex()}:{i}:{j}"
        msg[GROUP_KEY] = key
        view.parts[key] = Part(i, blocks, role, msg)
        view.messages.append(msg)
        content = envs[i].value.get("content")
        raws = content if isinstance(content, list) else [{"type": "text", "text": content}]
        view.tokens.append(sum(count_block(counter, raws[b], enc) for b in blocks) + (MESSAGE_OVERHEAD if first else 0))

    for i in range(start, len(envs)):
        env = envs[i]
        items = env.items
        if env.value.get("role") == "assistant":
            texts = [_text_part(it.text) for it in items if it.kind is Kind.ASSISTANT and it.text]
            calls = [{"id": it.call_id or "", "type": "function", "function": {"name": it.name or "tool",
                                                                               "arguments": it.args}}
                     for it in items if it.kind is Kind.TOOL_CALL and _type(it) == "tool_use"]
            msg: dict[str, Any] = {"role": "assistant", "content": texts or ""}
            if calls:
                msg["tool_calls"] = calls
            add(i, 0, list(range(len(items))), "assistant", msg, True)
            continue
        results = [b for b, it in enumerate(items) if it.kind is Kind.TOOL_RESULT]
        for j, b in enumerate(results):
            it = items[b]
            tool = {"role": "tool", "tool_call_id": it.call_id or "", "content": it.text}
            if it.name:
                tool["name"] = it.name
            add(i, j, [b], "tool", tool, j == 0)
        rest = [b for b in range(len(items)) if b not in results]
        if rest or not results:
            parts = [_text_part(items[b].text or f"[{_type(items[b])}]") for b in rest]
            add(i, len(results), rest, "user", {"role": "user", "content": parts}, not results)
    return view


def _unmarked(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_unmarked(v) for v in value]
    return value


def _type(item: Any) -> str:
    return str(item.raw.get("type")) if isinstance(item.raw, dict) else "block"


def _summary_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    raise NotMapped("a summary message without text")


def from_chat(view: ChatView, messages: list[dict[str, Any]], request: Request, adapter: Any,
              counter: TokenCounter) -> Conversation:
    """The forwarded Messages conversation for the stages' `messages` (tokens: the adapter's counts
    of new envelopes, the request's of the client's own)."""
    conv = request.conversation
    envs = conv.envelopes
    if not messages or messages[0].get("role") != "system" or GROUP_KEY in messages[0]:
        raise NotMapped("the first message is not the system prompt")
    out: list[Envelope] = []
    tokens: list[int] = []

    def put(env: Envelope, n: int | None = None) -> None:
        out.append(env)
        tokens.append(n if n is not None else adapter.count(env, request.encoding, counter))

    sys_content = messages[0].get("content")
    extra = sys_content[view.system_parts:] if isinstance(sys_content, list) else []
    if extra:
        original = envs[0].value["system"] if conv.n_system else None
        put(adapter._system_envelope({"system": with_annotation(original, _summary_of(extra))}))
    elif conv.n_system:
        put(envs[0], conv.tokens[0])
    # The stages' messages grouped by the envelope they stand for; a summary they made goes to the
    # group after it.
    summary: str | None = None
    groups: list[tuple[int, str | None, list[tuple[Part, dict[str, Any]]]]] = []
    for m in messages[1:]:
        key = m.get(GROUP_KEY)
        if key is None:
            if m.get("role") != "user" or summary is not None or groups:
                raise NotMapped(f"a {m.get('role')} message the stages made")
            summary = _summary_of(m.get("content"))
            continue
        part = view.parts.get(key)
        if part is None:
            raise NotMapped("a message naming no part")
        if groups and groups[-1][0] == part.env:
            groups[-1][2].append((part, m))
        else:
            groups.append((part.env, summary, [(part, m)]))
            summary = None
    if summary is not None or not groups:
        raise NotMapped("nothing kept after the summary")
    for e, lead, pieces in groups:
        env = envs[e]
        whole = sorted(b for p in view.parts.values() if p.env == e for b in p.blocks)
        untouched = all(m is p.message for p, m in pieces) and sorted(b for p, _ in pieces for b in p.blocks) == whole
        if lead is not None and env.value.get("role") == "assistant":
            put(adapter._envelope_like(with_summary([], summary_block(lead, _ttl(envs, e)))[0], env.turn))
            lead = None
        if untouched and lead is None:
            put(env, conv.tokens[e])
            continue
        content = env.value.get("content")
        raws = content if isinstance(content, list) else [{"type": "text", "text": content}]
        kept: dict[int, Any] = {}
        for p, m in pieces:
            if p.role == "tool" and m is not p.message and m.get("content") != p.message["content"]:
                kept[p.blocks[0]] = with_note(raws[p.blocks[0]], _summary_of(m.get("content")))
                continue
            if p.role == "user" and m is not p.message:
                new, old = m.get("content"), p.message["content"]
                if lead is not None or not (isinstance(new, list) and len(new) == len(old) + 1
                                            and all(a is b for a, b in zip(new[1:], old))):
                    raise NotMapped("a rewritten user message")
                lead = _summary_of(new[:1])
            kept.update({b: raws[b] for b in p.blocks})
        value = {**env.value, "content": [kept[b] for b in sorted(kept)]}
        if lead is not None:
            value = with_summary([value], summary_block(lead, _ttl(envs, e)))[0]
        put(adapter._envelope_like(value, env.turn))
    return Conversation(out, tokens)


def _ttl(envs: list[Envelope], start: int) -> dict[str, Any]:
    """The summary's cache_control: as long-lived as the longest breakpoint kept after it."""
    return breakpoints.summary_ttl({"messages": [e.value for e in envs[start:]]}, ("messages", -1))
