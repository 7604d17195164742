"""Anthropic's "the prompt does not fit" rejections (design.md § Messages API): HTTP 400 invalid_request_error
"prompt is too long: 210000 tokens > 200000 maximum", and the one for input plus max_tokens over
the window. A Messages-compatible server that words it otherwise (LiteLLM relaying another
backend) is recognized by the general rule."""

from __future__ import annotations

import re

import orjson

from proxy.upstream import is_context_overflow

_ANTHROPIC = re.compile(r"prompt is too long|input length and `?max_tokens`? exceed context limit", re.IGNORECASE)


def is_prompt_too_long(status: int, body: bytes) -> bool:
    if status != 400:
        return is_context_overflow(status, body)
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return is_context_overflow(status, body)
    err = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(err, dict) and err.get("type") == "invalid_request_error":
        if _ANTHROPIC.search(str(err.get("message", ""))):
            return True
    return is_context_overflow(status, body)
