"""How the chat fake counts a prompt (its window check and `usage.prompt_tokens`): about OpenAI's
own arithmetic, with the text counted by whichever tokenizer the fake is set to."""

from __future__ import annotations

from typing import Any, Callable

import orjson

IMAGE_TOKENS = 765  # fixed estimate per image part (a 512x512 high-detail image)

Count = Callable[[str], int]


def _part_tokens(part: dict[str, Any], count: Count) -> int:
    if isinstance(part.get("text"), str):
        return count(part["text"])
    if isinstance(part.get("refusal"), str):
        return count(part["refusal"])
    if part.get("type") == "image_url":
        return IMAGE_TOKENS
    return count(orjson.dumps(part).decode())


def message_tokens(m: dict[str, Any], count: Count) -> int:
    """~3 per message + role + content (+ name) + tool call names and arguments."""
    n = 3 + count(str(m.get("role", "")))
    content = m.get("content")
    if isinstance(content, str):
        n += count(content)
    elif isinstance(content, list):
        n += sum(_part_tokens(part, count) for part in content if isinstance(part, dict))
    if isinstance(m.get("name"), str):
        n += count(m["name"]) + 1
    for tc in m.get("tool_calls") or []:
        fn = tc.get("function") if isinstance(tc, dict) else None
        if isinstance(fn, dict):
            n += 3 + count(str(fn.get("name", ""))) + count(str(fn.get("arguments", "")))
    return n


def prompt_tokens(body: dict[str, Any], count: Count, scale: float) -> int:
    """The prompt's count: messages, tools and the priming of the reply, times `scale` (a model whose
    tokenizer counts more or less than the fake's)."""
    n = 3  # priming of the reply
    for m in body.get("messages") or []:
        if isinstance(m, dict):
            n += message_tokens(m, count)
    for tool in body.get("tools") or []:
        n += count(orjson.dumps(tool).decode())
    return int(n * scale)
