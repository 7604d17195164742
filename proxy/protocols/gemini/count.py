"""The proxy's own token count of a Gemini request (design.md § Counting tokens, for this protocol):
tiktoken over what each part says, Google's fixed count for an image or a file part, the JSON of
parts it cannot read; tool declarations as JSON. Cached per content like the other protocols'."""

from __future__ import annotations

from typing import Any, Hashable

from proxy import jsonbody
from proxy.protocols.gemini.body import CALL, MEDIA, RESPONSE, part_text, parts
from proxy.tokens import MESSAGE_OVERHEAD, TokenCounter

MEDIA_TOKENS = 258  # Gemini counts an image (up to 384 px a side, or each 768 px tile) as 258 tokens
CALL_OVERHEAD = 3


def count_part(counter: TokenCounter, part: Any, enc: str) -> int:
    if not isinstance(part, dict):
        return 0
    if part.get("thought") is True:
        return counter.count_text(str(part.get("text", "")), enc)
    if "text" in part:
        return counter.count_text(part_text(part), enc)
    for key, inner in ((CALL, "args"), (RESPONSE, "response")):
        if key in part:
            # the model reads the object as structured data: its JSON, escapes and all
            obj = part[key]
            return counter.count_text(f"{obj.get('name', '')}{jsonbody.dumps(obj.get(inner, {})).decode()}", enc) + \
                CALL_OVERHEAD
    if any(k in part for k in MEDIA):
        return MEDIA_TOKENS
    return counter.count_text(jsonbody.dumps(part).decode(), enc)


def count_content(counter: TokenCounter, content: Any, enc: str, key: Hashable) -> int:
    """One content, cached by `key`; a count known looked up first (as messages' count_message)."""
    key = ("gemini", key)
    n = counter.cached(enc, key)
    return n if n is not None else counter.count_message(
        content, enc, key, count=lambda c, e: MESSAGE_OVERHEAD + sum(count_part(counter, p, e) for p in parts(c)))
