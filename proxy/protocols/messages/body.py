"""Parsing and checking a Messages request body (pure: bytes in, body or an Anthropic-shaped 400
out). Only the structure the proxy reads is checked, with the API's wording (`messages.3.content:
Input should be a valid list`); what the upstream alone can judge (tool pairing, signatures) is
left to it. Also: what a block counts and reads as, for the token count and the summarizer."""

from __future__ import annotations

from typing import Any

from proxy import jsonbody
from proxy.protocols.messages.errors import invalid
from proxy.errors import ProxyError, Uncompactable

ROLES = ("user", "assistant")


def unreadable(e: jsonbody.Unreadable) -> ProxyError:
    return invalid(f"There was an error parsing the body of your request: {e.reason}.")


def too_deep() -> ProxyError:
    """A message nested deeper than the proxy writes (the adapter writes each message itself)."""
    return unreadable(jsonbody.too_deep())


def parse_messages_body(raw: bytes, *, before: list[Any] | None = None, whole: bool = True,
                        head: dict[str, Any] | None = None) -> dict[str, Any]:
    """Parse and validate a /v1/messages (or count_tokens) body; raises ProxyError(400).
    `before`: messages parsed (and checked) already, cut out of the front of `raw`'s array;
    `head`: the fields before the array, parsed and checked already, cut out of `raw`
    (proxy/reuse.py). `whole`: check that the whole body writes back as JSON; else only
    what is not `messages` (the adapter writes each message once, and checks it so: too_deep)."""
    try:
        body = jsonbody.load_request(raw)
        if head is not None:
            body = jsonbody.with_fields(head, body)
        known = 0
        if before is not None and isinstance(body, dict) and isinstance(body.get("messages"), list):
            body["messages"] = [*before, *body["messages"]]
            known = len(before)
        validate_messages_body(body, start=known)
        # the proxy writes the body again
        jsonbody.check_fields_writable(raw, body, None if whole else "messages", head, spliced=whole and known > 0)
    except jsonbody.Unreadable as e:
        raise unreadable(e) from None
    return body


def _kind(v: Any) -> str:
    return {dict: "dictionary", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(v), "number" if isinstance(v, (int, float)) else type(v).__name__)


def validate_messages_body(body: Any, start: int = 0) -> None:
    """The body's structure; the messages from `start` on (those before were checked already)."""
    if not isinstance(body, dict):
        raise invalid(f"Input should be a valid dictionary or object to extract fields from, got {_kind(body)}")
    if "model" not in body:  # (a local server picks its own: the upstream's to judge, forwarded as it came)
        raise Uncompactable(400, "model: Field required")
    if "messages" not in body:
        raise invalid("messages: Field required")
    if not isinstance(body["model"], str) or not body["model"]:
        raise invalid("model: Input should be a valid, non-empty string")
    msgs = body["messages"]
    if not isinstance(msgs, list):
        raise invalid(f"messages: Input should be a valid list, got {_kind(msgs)}")
    for i in range(start, len(msgs)):
        _check_message(i, msgs[i])
    system = body.get("system")
    if system is not None:
        if isinstance(system, list):
            for j, b in enumerate(system):
                if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
                    raise invalid(f"system.{j}: Input should be a text block with a string 'text'")
        elif not isinstance(system, str):
            raise invalid(f"system: Input should be a valid string or list of text blocks, got {_kind(system)}")
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise invalid(f"stream: Input should be a valid boolean, got {_kind(body['stream'])}")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise invalid(f"tools: Input should be a valid list, got {_kind(tools)}")


def _check_message(i: int, m: Any) -> None:
    if not isinstance(m, dict):
        raise invalid(f"messages.{i}: Input should be a valid dictionary, got {_kind(m)}")
    role = m.get("role")
    if role not in ROLES:
        raise invalid(f"messages.{i}.role: Input should be 'user' or 'assistant'")
    if "content" not in m:
        raise invalid(f"messages.{i}.content: Field required")
    content = m["content"]
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise invalid(f"messages.{i}.content: Input should be a valid string or list of content blocks, got "
                      f"{_kind(content)}")
    for j, b in enumerate(content):
        at = f"messages.{i}.content.{j}"
        if not isinstance(b, dict) or not isinstance(b.get("type"), str):
            raise invalid(f"{at}: Unable to extract tag using discriminator 'type'")
        t = b["type"]
        if t == "text" and not isinstance(b.get("text"), str):
            raise invalid(f"{at}.text: Input should be a valid string")
        if t in ("tool_use", "server_tool_use") and not isinstance(b.get("id"), str):
            raise invalid(f"{at}.{t}.id: Input should be a valid string")
        if t == "tool_result":
            if not isinstance(b.get("tool_use_id"), str):
                raise invalid(f"{at}.tool_result.tool_use_id: Input should be a valid string")
            inner = b.get("content")
            if inner is not None and not isinstance(inner, (str, list)):
                raise invalid(f"{at}.tool_result.content: Input should be a valid string or list of content blocks")
            for k, x in enumerate(inner if isinstance(inner, list) else ()):
                if not isinstance(x, dict) or not isinstance(x.get("type"), str):
                    raise invalid(f"{at}.tool_result.content.{k}: Unable to extract tag using discriminator 'type'")


# ---- what blocks read and count as ------------------------------------------------------------

def blocks(content: Any) -> list[Any]:
    """A message's (or a tool result's) content as blocks: a string is one text block."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return content if isinstance(content, list) else []


def system_blocks(body: dict[str, Any]) -> list[Any]:
    return blocks(body.get("system")) if body.get("system") is not None else []


def block_text(block: Any) -> str:
    """What a block says, as the summarizer and the counter read it: text, a call as name(input),
    a tool result's text; thinking (signed, the model's own) and opaque blocks read as nothing."""
    if not isinstance(block, dict):
        return ""
    t = block.get("type")
    if t == "text":
        return str(block.get("text", ""))
    if t in ("tool_use", "server_tool_use"):
        return f"{block.get('name', '')}({jsonbody.dumps(block.get('input', {})).decode()})"
    if t == "tool_result":
        return "\n".join(s for s in (block_text(b) for b in blocks(block.get("content"))) if s)
    return ""


def content_text(content: Any) -> str:
    return "\n".join(s for s in (block_text(b) for b in blocks(content)) if s)
