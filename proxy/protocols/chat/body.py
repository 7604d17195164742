"""Parsing and checking a chat completion request body (pure: bytes in, request or error out).

Only the structure the proxy relies on is checked (types of the fields it reads). Semantics such as
tool-call pairing are the upstream's to judge: the proxy forwards and lets the upstream answer.
"""

from __future__ import annotations

from typing import Any


from proxy import jsonbody
from proxy.errors import ProxyError, Uncompactable, bad_request, unreadable

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
SYSTEM_ROLES = frozenset({"system", "developer"})


def parse_chat_body(raw: bytes, *, before: list[Any] | None = None,
                    head: dict[str, Any] | None = None) -> dict[str, Any]:
    """Parse and validate; raises ProxyError(400) naming the offending field. `before`: messages
    parsed already, cut out of the front of `raw`'s array; `head`: the fields before the array,
    parsed and checked already, cut out of `raw` (proxy/reuse.py)."""
    try:
        body = jsonbody.load_request(raw)
        if head is not None:
            body = jsonbody.with_fields(head, body)
    except jsonbody.Unreadable as e:
        raise unreadable(e) from None
    if before is not None and isinstance(body, dict) and isinstance(body.get("messages"), list):
        body["messages"] = [*before, *body["messages"]]
    validate_chat_body(body, messages=False)
    # The proxy writes the request again (message keys, tool counts, the forwarded body). The
    # messages are checked by the chat adapter's parse, once per distinct message. (A message 253
    # or 254 levels deep passes, and a rewrite of it fails open in the pipeline.)
    try:
        jsonbody.check_fields_writable(raw, body, "messages", head)
    except jsonbody.Unreadable as e:
        raise unreadable(e) from None
    return body


def too_deep() -> ProxyError:
    """A message nested deeper than the proxy writes (the adapter writes each message itself)."""
    return unreadable(jsonbody.too_deep())


def _type_name(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(v), "number" if isinstance(v, (int, float)) else type(v).__name__
    )


def validate_chat_body(body: Any, *, messages: bool = True) -> None:
    """The fields the proxy reads; each message too unless `messages` is False (then the adapter
    checks each distinct message once, so a long history is not re-checked on every request)."""
    if not isinstance(body, dict):
        raise bad_request(f"Request body must be a JSON object, got {_type_name(body)}.")
    model = body.get("model")
    if model is None:  # (a local server picks its own: the upstream's to judge, forwarded as it came)
        raise Uncompactable(400, "'model' is required and must be a non-empty string.", param="model")
    if model == "":
        raise bad_request("'model' is required and must be a non-empty string.", param="model")
    if not isinstance(model, str):
        raise bad_request(f"'model' must be a string, got {_type_name(model)}.", param="model")
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        raise bad_request(
            "'messages' is required." if msgs is None
            else f"'messages' must be an array, got {_type_name(msgs)}.",
            param="messages",
        )
    if not msgs:
        raise bad_request("'messages' must contain at least one message.", param="messages")
    if messages:
        for i, msg in enumerate(body["messages"]):
            validate_message(msg, f"messages[{i}]")
    for name in ("stream",):
        if name in body and body[name] is not None and not isinstance(body[name], bool):
            raise bad_request(f"'{name}' must be a boolean, got {_type_name(body[name])}.", param=name)
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad_request(f"'tools' must be an array, got {_type_name(tools)}.", param="tools")


def validate_message(msg: Any, where: str) -> None:
    if not isinstance(msg, dict):
        raise bad_request(f"{where} must be an object, got {_type_name(msg)}.", param=where)
    role = msg.get("role")
    if not isinstance(role, str):
        raise bad_request(f"{where}.role is required and must be a string.", param=f"{where}.role")
    if role not in ROLES:
        raise bad_request(
            f"{where}.role '{role[:40]}' is not one of {sorted(ROLES - {'function'})}.", param=f"{where}.role"
        )
    content = msg.get("content")
    if content is not None and not isinstance(content, (str, list)):
        raise bad_request(
            f"{where}.content must be a string, an array of content parts, or null; got {_type_name(content)}.",
            param=f"{where}.content",
        )
    if isinstance(content, list):
        for j, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise bad_request(
                    f"{where}.content[{j}] must be an object with a string 'type'.", param=f"{where}.content[{j}]"
                )
            if part["type"] == "text" and not isinstance(part.get("text"), str):
                raise bad_request(f"{where}.content[{j}].text must be a string.", param=f"{where}.content[{j}].text")
    calls = msg.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise bad_request(f"{where}.tool_calls must be an array.", param=f"{where}.tool_calls")
        for j, call in enumerate(calls):
            p = f"{where}.tool_calls[{j}]"
            if not isinstance(call, dict) or not isinstance(call.get("id"), str):
                raise bad_request(f"{p} must be an object with a string 'id'.", param=p)
            fn = call.get("function")
            if fn is not None and (
                not isinstance(fn, dict)
                or not isinstance(fn.get("name"), str)
                or not isinstance(fn.get("arguments", ""), str)
            ):
                raise bad_request(f"{p}.function must have a string 'name' and string 'arguments'.", param=f"{p}.function")
    if role == "tool" and not isinstance(msg.get("tool_call_id"), str):
        raise bad_request(f"{where}.tool_call_id is required for role 'tool' and must be a string.", param=f"{where}.tool_call_id")
    if "name" in msg and msg["name"] is not None and not isinstance(msg["name"], str):
        raise bad_request(f"{where}.name must be a string.", param=f"{where}.name")


def message_text(msg: dict[str, Any]) -> str:
    """The plain text of a message's content (text parts joined)."""
    content = msg.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


def latest_user_index(messages: list[dict[str, Any]]) -> int | None:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return i
    return None

