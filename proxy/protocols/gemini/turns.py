"""Where a Gemini history may be cut and how the kept part is put back together (design.md §
Gemini API), as pure functions over the request's `contents`.

A content (one role's turn) keeps its parts together, so cuts fall between contents, and only
where the role changes. A user content carrying functionResponse parts answers the model content
before it: no cut right before it, so a kept response keeps its call, and the model content whose
calls the kept part answers is kept whole with its thoughtSignatures, byte for byte. The history
then starts with the summary as a user content, merged into the first kept one when that is a
user content (roles alternate)."""

from __future__ import annotations

from typing import Any

from proxy.protocols.gemini.body import CALL, RESPONSE, SKIP_SIGNATURE, parts, role

SIGNATURE = "thoughtSignature"


def has(content: Any, key: str) -> bool:
    return any(isinstance(p, dict) and key in p for p in parts(content))


def cut_allowed_at(contents: list[dict[str, Any]], i: int) -> bool:
    """May contents[:i] be summarized and contents[i:] kept? (It reads contents i-1 and i only,
    so a grown history asks it of its new contents alone.)"""
    if i == 0:
        return False
    r = role(contents[i])
    if r == role(contents[i - 1]):
        return False
    return r == "model" or not has(contents[i], RESPONSE)


def call_ids(content: dict[str, Any]) -> list[str | None]:
    """Each part's pairing key: a call's or a response's `id` when given, else its name and its
    rank among the parts of that name in its content (the API pairs them so, in order)."""
    seen: dict[tuple[str, str], int] = {}
    keys: list[str | None] = []
    for p in parts(content):
        key = CALL if isinstance(p, dict) and CALL in p else RESPONSE if isinstance(p, dict) and RESPONSE in p else None
        if key is None:
            keys.append(None)
            continue
        obj = p[key]
        if isinstance(obj.get("id"), str) and obj["id"]:
            keys.append(obj["id"])
            continue
        name = str(obj.get("name"))
        n = seen[(key, name)] = seen.get((key, name), -1) + 1
        keys.append(f"{name}#{n}")
    return keys


def with_summary(kept: list[dict[str, Any]], summary: str) -> list[dict[str, Any]]:
    """The forwarded history: the summary first, merged into the first kept content when that is
    a user content (a new, copied content; the others are the client's own objects)."""
    part = {"text": summary}
    if kept and role(kept[0]) == "user":
        first = kept[0]
        return [{**first, "parts": [part, *parts(first)]}, *kept[1:]]
    return [{"role": "user", "parts": [part]}, *kept]


def with_annotation(system: Any, text: str) -> dict[str, Any]:
    """`systemInstruction` with the annotation as one more text part (the client's parts keep
    their bytes), or one made of it."""
    if not isinstance(system, dict):
        return {"parts": [{"text": text}]}
    return {**system, "parts": [*parts(system), {"text": text}]}


def with_note(part: dict[str, Any], note: str, is_error: bool) -> dict[str, Any]:
    """A functionResponse part whose response is replaced by the proxy's note: name and id kept,
    an error stays an error."""
    response = dict(part[RESPONSE])
    response["response"] = {"error" if is_error else "output": note}
    return {**part, RESPONSE: response}


def is_error(response: Any) -> bool:
    inner = response.get("response") if isinstance(response, dict) else None
    return isinstance(inner, dict) and "error" in inner and "output" not in inner


def unsigned(content: dict[str, Any]) -> dict[str, Any] | None:
    """A model content made under a prefix the compaction changed: its thought parts dropped, its
    calls' signatures replaced by the API's documented skip value (a call in the current turn must
    carry one), other signatures dropped. None when it carries no thought and no signature."""
    ps = parts(content)
    if not any(isinstance(p, dict) and (SIGNATURE in p or p.get("thought") is True) for p in ps):
        return None
    out = []
    for p in ps:
        if not isinstance(p, dict) or p.get("thought") is True:
            continue
        if SIGNATURE in p:
            p = {k: v for k, v in p.items() if k != SIGNATURE}
            if CALL in p:
                p[SIGNATURE] = SKIP_SIGNATURE
        out.append(p)
    return {**content, "parts": out or [{"text": ""}]}
